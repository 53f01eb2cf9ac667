#include "model/step_profile.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/json.hpp"

namespace gpt2 {

namespace {

// A rate column: TFLOP/s where the work is counted in flops, GB/s where in bytes, blank otherwise.
std::string rate_cell(double work, double ms, double unit, int width) {
  char b[32];
  if (work > 0 && ms > 0)
    std::snprintf(b, sizeof(b), "%*.1f", width, work / (ms * 1e-3) / unit);
  else
    std::snprintf(b, sizeof(b), "%*s", width, "");
  return b;
}

// A table row without the blanks that empty rate cells leave at its end.
std::string trimmed_line(const char* text) {
  std::string s = text;
  s.erase(s.find_last_not_of(' ') + 1);
  return s + "\n";
}

}  // namespace

void StepProfile::add(const std::string& name, const std::string& kind, double ms, double flops, double bytes) {
  auto it = std::find_if(ops_.begin(), ops_.end(), [&](const OpTime& o) { return o.name == name; });
  if (it == ops_.end()) {
    ops_.push_back({name, kind, 0, 0, 0, 0});
    it = ops_.end() - 1;
  }
  ++it->calls;
  it->ms += ms;
  it->flops += flops;
  it->bytes += bytes;
}

double StepProfile::ops_ms() const {
  double s = 0;
  for (const OpTime& o : ops_) s += o.ms;
  return s;
}

std::string StepProfile::table(const std::string& heading, double step_ms) const {
  const double device_ms = ops_ms() + idle_ms_;
  auto share = [&](double ms) { return device_ms > 0 ? 100.0 * ms / device_ms : 0.0; };
  size_t w = std::string("(device idle: waiting for the host)").size();
  for (const OpTime& o : ops_) w = std::max(w, o.name.size());
  const int nw = static_cast<int>(w);

  std::string out = heading + "\n";
  char line[512];
  std::snprintf(line, sizeof(line), "  %-*s %6s %9s %7s %9s %9s\n", nw, "op", "calls", "ms", "share", "TFLOP/s",
                "GB/s");
  out += line;
  std::vector<const OpTime*> by_time;
  for (const OpTime& o : ops_) by_time.push_back(&o);
  std::stable_sort(by_time.begin(), by_time.end(), [](const OpTime* a, const OpTime* b) { return a->ms > b->ms; });
  for (const OpTime* o : by_time) {
    std::snprintf(line, sizeof(line), "  %-*s %6d %9.3f %6.1f%% %s %s", nw, o->name.c_str(), o->calls, o->ms,
                  share(o->ms), rate_cell(o->flops, o->ms, 1e12, 9).c_str(),
                  rate_cell(o->bytes, o->ms, 1e9, 9).c_str());
    out += trimmed_line(line);
  }
  std::snprintf(line, sizeof(line), "  %-*s %6s %9.3f %6.1f%%\n", nw, "(device idle: waiting for the host)", "",
                idle_ms_, share(idle_ms_));
  out += line;
  std::snprintf(line, sizeof(line), "  device time %.3f ms (ops %.3f, idle %.3f); the step took %.3f ms on the host\n",
                device_ms, ops_ms(), idle_ms_, step_ms);
  out += line;

  // By kind: the ops summed as a profile of their own, named by kind (in the order the kinds first ran).
  StepProfile by_kind;
  for (const OpTime& o : ops_) by_kind.add(o.kind, o.kind, o.ms, o.flops, o.bytes);
  std::vector<OpTime> kinds = by_kind.ops();
  std::stable_sort(kinds.begin(), kinds.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  out += "  by kind:";
  for (size_t i = 0; i < kinds.size(); ++i) {
    const OpTime& k = kinds[i];
    std::snprintf(line, sizeof(line), "%s %s %.3f ms %.1f%%", i ? " |" : "", k.kind.c_str(), k.ms, share(k.ms));
    out += line;
    if (k.flops > 0 && k.ms > 0)
      std::snprintf(line, sizeof(line), " %.1f TFLOP/s", k.flops / (k.ms * 1e-3) / 1e12);
    else if (k.bytes > 0 && k.ms > 0)
      std::snprintf(line, sizeof(line), " %.1f GB/s", k.bytes / (k.ms * 1e-3) / 1e9);
    else
      line[0] = '\0';
    out += line;
  }
  out += "\n";
  return out;
}

std::string StepProfile::json(long step, double step_ms) const {
  char b[256];
  std::snprintf(b, sizeof(b), "{\"profile_step\":%ld,\"step_ms\":%.4f,\"device_ms\":%.4f,\"idle_ms\":%.4f,\"ops\":[",
                step, step_ms, ops_ms() + idle_ms_, idle_ms_);
  std::string out = b;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const OpTime& o = ops_[i];
    out += i ? "," : "";
    out += "{\"op\":" + json_quote(o.name) + ",\"kind\":" + json_quote(o.kind);
    std::snprintf(b, sizeof(b), ",\"calls\":%d,\"ms\":%.4f,\"flops\":%.17g,\"bytes\":%.17g}", o.calls, o.ms, o.flops,
                  o.bytes);
    out += b;
  }
  return out + "]}";
}

}  // namespace gpt2
