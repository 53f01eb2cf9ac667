// The message of a Boost.ProgramOptions error, safe for any input (the three gpt2-* programs).
#pragma once

#include <boost/program_options/errors.hpp>
#include <boost/program_options/parsers.hpp>

#include <cctype>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace gpt2 {

namespace option_errors_detail {
// Names the protected substitution map of error_with_option_name (never constructed): a pointer to a
// member taken through a derived class may be applied to any object of the base.
struct Substitutions : boost::program_options::error_with_option_name {
  static std::map<std::string, std::string> boost::program_options::error_with_option_name::*member() {
    return &Substitutions::m_substitutions;
  }
};
}  // namespace option_errors_detail

// e.what(), without Boost's hang. Boost (1.74) formats a message by replacing each placeholder such as
// "%value%" with its text until none is left (error_with_option_name::replace_token), so a text that
// contains a placeholder loops forever: `gpt2-train --recompute %value%` hung, and so did
// `gpt2-train --a%canonical_option%=`, whose option name comes back through the derived placeholder
// "%canonical_option%" (both found by fuzz_train_options). So no substituted text may hold a placeholder
// at all: a space goes after every '%' that could open one ("% value%"); "50%" reads as it was written.
inline std::string option_error_message(const boost::program_options::error& e) {
  namespace po = boost::program_options;
  if (const auto* named = dynamic_cast<const po::error_with_option_name*>(&e)) {
    // The exception object itself is not const (a caught exception is a copy the handler owns).
    auto& subs = const_cast<po::error_with_option_name&>(*named).*option_errors_detail::Substitutions::member();
    for (auto& entry : subs) {
      std::string& text = entry.second;
      for (size_t pos = text.find('%'); pos != std::string::npos; pos = text.find('%', pos + 1)) {
        const bool opens_name = pos + 1 < text.size() && (std::isalnum(static_cast<unsigned char>(text[pos + 1])) ||
                                                           text[pos + 1] == '_');
        if (opens_name) text.insert(pos + 1, " ");
      }
    }
  }
  return e.what();
}

// A word of the command line that is neither an option nor an option's value is an error. Without a
// positional description Boost.ProgramOptions sets such words aside and parsing succeeds: `--lr 0.1 0.2`
// trained with 0.1, `--prompt And God` sampled from "And", `gpt2-train ci.ini` said only that no model was
// given. Throws a po::error (the callers' usage error, exit status 2) naming the first of them.
// `hint` ends the message (gpt2-train's: where a config file goes).
inline void reject_stray_words(const boost::program_options::parsed_options& parsed, const std::string& hint = "") {
  namespace po = boost::program_options;
  const std::vector<std::string> stray = po::collect_unrecognized(parsed.options, po::include_positional);
  if (!stray.empty())
    throw po::error("unexpected argument '" + stray.front() + "': each option takes one value (quote a value that " +
                    "has spaces" + hint + ")");
}

// Boost reads "-1" into an unsigned option as 2^64 - 1 without a word (`--seed -1` seeded with
// 18446744073709551615): a value of one of `names` that starts with '-' is a po::error naming the option.
inline void reject_negative_unsigned(const boost::program_options::parsed_options& parsed,
                                     std::initializer_list<const char*> names) {
  namespace po = boost::program_options;
  for (const po::option& o : parsed.options)
    for (const char* name : names)
      if (o.string_key == name)
        for (const std::string& v : o.value)
          if (v.find_first_not_of(" \t") != std::string::npos && v[v.find_first_not_of(" \t")] == '-')
            throw po::error("--" + o.string_key + " must be a whole number >= 0 (got '" + v + "')");
}

}  // namespace gpt2
