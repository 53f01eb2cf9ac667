// A setting named by an environment variable, read where a kernel family decides its path (the attention
// paths, the GEMM's opt-ins): unset or empty gives the first choice (the default), a choice's name gives
// its value, anything else is fatal, naming the variable and every choice. Host code only.
#pragma once

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace gpt2::kernels {

template <class T>
T choice_from_env(const char* var, const char* what, std::initializer_list<std::pair<const char*, T>> choices) {
  const char* env = std::getenv(var);
  if (env == nullptr || *env == '\0') return choices.begin()->second;
  std::string names;
  for (const auto& [name, value] : choices) {
    if (std::strcmp(env, name) == 0) return value;
    names += names.empty() ? std::string(name) + " (the default)" : std::string(", ") + name;
  }
  GPT2_CHECK(false, "" << var << "='" << env << "' is not a " << what << ": use " << names);
  return choices.begin()->second;
}

}  // namespace gpt2::kernels
