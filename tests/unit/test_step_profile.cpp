// The --profile-step report (model/step_profile.hpp): launches summed by name, the rates, the shares, the
// idle row and the JSON line. The CUDA events that feed it run on the emulator (emu/train_emu.py) and the GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "model/step_profile.hpp"
#include "train/metrics.hpp"

namespace gpt2 {
namespace {

// The report's row for `name` (its first line that starts with two spaces and the name), or "".
std::string row_of(const std::string& table, const std::string& name) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("  " + name + " ", 0) == 0) return line;
  return "";
}

// The whitespace-separated fields of a row after its name.
std::vector<std::string> fields_after(const std::string& row, const std::string& name) {
  std::istringstream in(row.substr(2 + name.size()));
  std::vector<std::string> f;
  for (std::string w; in >> w;) f.push_back(w);
  return f;
}

StepProfile two_layer_step() {
  StepProfile p;
  // Two layers of a GEMM (1 TFLOP each in 2 ms: 500 TFLOP/s) and a layernorm (3 GB in 1 ms: 3000 GB/s)
  for (int l = 0; l < 2; ++l) {
    p.add("gemm qkv forward", "gemm", 2.0, 1e12, 0);
    p.add("layernorm backward", "layernorm", 1.0, 0, 3e9);
  }
  p.add("attention backward", "attention", 5.0, 1e12, 1e9);  // 200 TFLOP/s and 200 GB/s
  p.add_idle(1.0);
  return p;
}

TEST(StepProfile, SumsLaunchesByNameInTheOrderTheyFirstRan) {
  const StepProfile p = two_layer_step();
  ASSERT_EQ(p.ops().size(), 3u);
  EXPECT_EQ(p.ops()[0].name, "gemm qkv forward");
  EXPECT_EQ(p.ops()[0].calls, 2);
  EXPECT_DOUBLE_EQ(p.ops()[0].ms, 4.0);
  EXPECT_DOUBLE_EQ(p.ops()[0].flops, 2e12);
  EXPECT_EQ(p.ops()[1].name, "layernorm backward");
  EXPECT_DOUBLE_EQ(p.ops()[1].bytes, 6e9);
  EXPECT_EQ(p.ops()[2].calls, 1);
  EXPECT_DOUBLE_EQ(p.ops_ms(), 11.0);
  EXPECT_DOUBLE_EQ(p.idle_ms(), 1.0);
}

TEST(StepProfile, TableGivesTimesSharesAndRatesLongestFirst) {
  const std::string t = two_layer_step().table("profile of step 3", 12.5);
  EXPECT_EQ(t.rfind("profile of step 3\n", 0), 0u) << t;
  // calls, ms, share of the device time (ops 11 + idle 1), then TFLOP/s and GB/s where counted
  const std::vector<std::string> gemm = fields_after(row_of(t, "gemm qkv forward"), "gemm qkv forward");
  EXPECT_EQ(gemm, (std::vector<std::string>{"2", "4.000", "33.3%", "500.0"})) << t;
  const std::vector<std::string> ln = fields_after(row_of(t, "layernorm backward"), "layernorm backward");
  EXPECT_EQ(ln, (std::vector<std::string>{"2", "2.000", "16.7%", "3000.0"})) << t;
  const std::vector<std::string> att = fields_after(row_of(t, "attention backward"), "attention backward");
  EXPECT_EQ(att, (std::vector<std::string>{"1", "5.000", "41.7%", "200.0", "200.0"})) << t;
  const std::string idle = "(device idle: waiting for the host)";
  EXPECT_EQ(fields_after(row_of(t, idle), idle), (std::vector<std::string>{"1.000", "8.3%"})) << t;
  // longest first: attention (5 ms), gemm (4), layernorm (2)
  EXPECT_LT(t.find("  attention backward"), t.find("  gemm qkv forward"));
  EXPECT_LT(t.find("  gemm qkv forward"), t.find("  layernorm backward"));
  EXPECT_NE(t.find("device time 12.000 ms (ops 11.000, idle 1.000); the step took 12.500 ms on the host"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("by kind: attention 5.000 ms 41.7% 200.0 TFLOP/s | gemm 4.000 ms 33.3% 500.0 TFLOP/s | "
                   "layernorm 2.000 ms 16.7% 3000.0 GB/s"),
            std::string::npos)
      << t;
}

TEST(StepProfile, JsonLineParsesAndCarriesEveryOp) {
  StepProfile p = two_layer_step();
  p.add("op with \"quotes\"", "copy", 0.5, 0, 0);
  const JsonValue j = parse_json(p.json(7, 13.0), "profile line");
  int64_t step = 0;
  ASSERT_TRUE(j.get("profile_step") && j.get("profile_step")->as_int64(&step));
  EXPECT_EQ(step, 7);
  EXPECT_DOUBLE_EQ(std::stod(j.get("step_ms")->text), 13.0);
  EXPECT_DOUBLE_EQ(std::stod(j.get("device_ms")->text), 12.5);
  EXPECT_DOUBLE_EQ(std::stod(j.get("idle_ms")->text), 1.0);
  const JsonValue* ops = j.get("ops");
  ASSERT_TRUE(ops && ops->kind == JsonValue::Kind::kArray);
  ASSERT_EQ(ops->array.size(), 4u);
  EXPECT_EQ(ops->array[0].get("op")->text, "gemm qkv forward");
  EXPECT_EQ(ops->array[0].get("kind")->text, "gemm");
  EXPECT_DOUBLE_EQ(std::stod(ops->array[0].get("flops")->text), 2e12);
  EXPECT_EQ(ops->array[3].get("op")->text, "op with \"quotes\"");
  int64_t calls = 0;
  ASSERT_TRUE(ops->array[1].get("calls")->as_int64(&calls));
  EXPECT_EQ(calls, 2);
}

TEST(StepProfile, AnEmptyProfileStillReports) {
  const StepProfile p;
  EXPECT_TRUE(p.empty());
  const std::string t = p.table("nothing", 1.0);
  EXPECT_NE(t.find("device time 0.000 ms"), std::string::npos) << t;
  EXPECT_EQ(parse_json(p.json(1, 1.0), "empty").get("ops")->array.size(), 0u);
}

// A resumed run rewrites metrics.jsonl without the lines of steps after its checkpoint (MetricsWriter), so no
// step appears twice: --profile-step's line of a later step goes with them.
TEST(StepProfile, AResumeDropsTheProfileLinesOfLaterSteps) {
  const std::string dir = ::testing::TempDir() + "profile_resume_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/metrics.jsonl");
    for (long s = 1; s <= 4; ++s) {
      f << "{\"step\":" << s << ",\"loss\":1}\n";
      if (s % 2 == 0) f << StepProfile().json(s, 1.0) << "\n";
    }
  }
  { MetricsWriter keep(dir, /*append=*/true, /*keep_up_to_step=*/2); }
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("{\"step\":1,", 0), 0u);
  EXPECT_EQ(lines[1].rfind("{\"step\":2,", 0), 0u);
  EXPECT_EQ(lines[2].rfind("{\"profile_step\":2,", 0), 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpt2
