// The message of a Boost.ProgramOptions error, safe for any input (the three gpt2-* programs).
#pragma once

#include <boost/program_options/errors.hpp>

#include <map>
#include <string>

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

// e.what(), without Boost's hang. Boost (1.74) formats a message by replacing a placeholder such as
// "%value%" with the user's text until none is left (error_with_option_name::replace_token), so text
// that contains its own placeholder loops forever: `gpt2-train --recompute %value%` hung (found by
// fuzz_train_options). Such text gets a space after the first '%' ("% value%") before the message is made.
inline std::string option_error_message(const boost::program_options::error& e) {
  namespace po = boost::program_options;
  if (const auto* named = dynamic_cast<const po::error_with_option_name*>(&e)) {
    // The exception object itself is not const (a caught exception is a copy the handler owns).
    auto& subs = const_cast<po::error_with_option_name&>(*named).*option_errors_detail::Substitutions::member();
    for (auto& [key, text] : subs) {
      const std::string token = "%" + key + "%";
      for (size_t pos = text.find(token); pos != std::string::npos; pos = text.find(token, pos + token.size() + 1))
        text.insert(pos + 1, " ");
    }
  }
  return e.what();
}

}  // namespace gpt2
