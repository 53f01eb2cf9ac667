#include "kernels/common/kernel_paths.hpp"

#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace gpt2::kernels {
namespace {

std::mutex g_mu;
std::vector<std::pair<const char*, std::vector<const char*>>> g_paths;  // op -> paths, in first-use order

bool same(const char* a, const char* b) {
  return a == b || std::strcmp(a, b) == 0;
}

}  // namespace

void record_kernel_path(const char* op, const char* path) {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto& entry : g_paths) {
    if (!same(entry.first, op)) continue;
    for (const char* p : entry.second)
      if (same(p, path)) return;
    entry.second.push_back(path);
    return;
  }
  g_paths.push_back({op, {path}});
}

std::string kernel_paths_used() {
  std::lock_guard<std::mutex> g(g_mu);
  std::string s;
  for (const auto& entry : g_paths) {
    s += (s.empty() ? "" : "; ") + std::string(entry.first) + ":";
    for (size_t i = 0; i < entry.second.size(); ++i) s += (i ? ", " : " ") + std::string(entry.second[i]);
  }
  return s;
}

void reset_kernel_paths() {
  std::lock_guard<std::mutex> g(g_mu);
  g_paths.clear();
}

}  // namespace gpt2::kernels
