// The progress renderer in its three forms, driven by a fake clock: what each line holds (bar,
// bytes, rate over the window, ETA), how often lines are written, and the final line.
#include "sidecar/cli/progress.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kMiB = uint64_t{1} << 20;

class FakeClock final : public common::Clock {
 public:
  int64_t NowUnixMs() override { return 1'700'000'000'000 + now_ms_; }
  int64_t MonotonicMs() override { return now_ms_; }
  void SleepMs(int64_t ms) override { now_ms_ += ms; }
  void Set(int64_t ms) { now_ms_ = ms; }

 private:
  int64_t now_ms_ = 0;
};

// The lines written so far (split at '\n'), without a trailing empty one.
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// The frames a terminal was sent: what follows each '\r'.
std::vector<std::string> Frames(const std::string& text) {
  std::vector<std::string> frames = absl::StrSplit(text, '\r');
  frames.erase(frames.begin());  // before the first '\r'
  return frames;
}

TEST(ProgressTest, HumanUnits) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(10.0 * kMiB), "10.0 MiB");
  EXPECT_EQ(HumanBytes(3.25 * 1024 * kMiB), "3.2 GiB");
  EXPECT_EQ(HumanDuration(-1), "--:--");
  EXPECT_EQ(HumanDuration(7), "0:07");
  EXPECT_EQ(HumanDuration(754), "12:34");
  EXPECT_EQ(HumanDuration(3723), "1:02:03");
}

TEST(ProgressTest, ModeFollowsJsonThenTheTerminal) {
  EXPECT_EQ(ProgressModeFor(/*json=*/true, /*err_is_terminal=*/true), ProgressMode::kJson);
  EXPECT_EQ(ProgressModeFor(/*json=*/false, /*err_is_terminal=*/true), ProgressMode::kTerminal);
  EXPECT_EQ(ProgressModeFor(/*json=*/false, /*err_is_terminal=*/false), ProgressMode::kPlain);
}

TEST(ProgressTest, TerminalRedrawsOneLineWithBarRateAndEta) {
  FakeClock clock;
  std::ostringstream err;
  ProgressRenderer progress(err, ProgressMode::kTerminal, "publish", &clock);
  progress.Update("hashing", 0, 10 * kMiB);
  ASSERT_EQ(Frames(err.str()).size(), 1u);
  EXPECT_EQ(Frames(err.str())[0],
            "publish hashing [----------------]   0%  0 B/10.0 MiB  --/s  ETA --:--");

  clock.Set(1000);
  progress.Update("hashing", 2 * kMiB, 10 * kMiB);
  ASSERT_EQ(Frames(err.str()).size(), 2u);
  // 2 MiB in the last second: 2 MiB/s, 8 MiB left → 4 s.
  EXPECT_EQ(Frames(err.str())[1],
            "publish hashing [###-------------]  20%  2.0 MiB/10.0 MiB  2.0 MiB/s  ETA 0:04");

  // At most one redraw per kTerminalRedrawMs.
  clock.Set(1050);
  progress.Update("hashing", 2 * kMiB + kMiB / 10, 10 * kMiB);
  EXPECT_EQ(Frames(err.str()).size(), 2u);
  clock.Set(1099);
  progress.Update("hashing", 2 * kMiB + kMiB / 5, 10 * kMiB);
  EXPECT_EQ(Frames(err.str()).size(), 2u);
  clock.Set(1100);
  progress.Update("hashing", 3 * kMiB, 10 * kMiB);
  EXPECT_EQ(Frames(err.str()).size(), 3u);
  EXPECT_THAT(Frames(err.str())[2], HasSubstr("30%  3.0 MiB/10.0 MiB"));
  EXPECT_EQ(err.str().find('\n'), std::string::npos) << "no newline while it runs";

  // The rate is over the last kRateWindowMs: the samples before 3.5 s drop out.
  clock.Set(8500);
  progress.Update("hashing", 8 * kMiB, 10 * kMiB);
  // Window: (1100 ms, 3 MiB) .. (8500, 8) → 5 MiB in 7.4 s; samples older than 5 s are dropped
  // only while two newer ones remain.
  EXPECT_THAT(Frames(err.str()).back(), HasSubstr("80%  8.0 MiB/10.0 MiB  691.9 KiB/s"));
  clock.Set(9000);
  progress.Update("hashing", 9 * kMiB, 10 * kMiB);
  // Window now (8500, 8 MiB) .. (9000, 9 MiB): 2 MiB/s, 1 MiB left → 1 s.
  EXPECT_THAT(Frames(err.str()).back(), HasSubstr("90%  9.0 MiB/10.0 MiB  2.0 MiB/s  ETA 0:01"));

  // A new phase is drawn at once, restarts the rate, and the shorter line blanks the longer.
  clock.Set(9010);
  std::string before = Frames(err.str()).back();
  before.erase(before.find_last_not_of(' ') + 1);
  progress.Update("manifest", 0, 0);
  std::string frame = Frames(err.str()).back();
  EXPECT_EQ(frame.size(), before.size());
  EXPECT_EQ(frame.substr(0, frame.find_last_not_of(' ') + 1), "publish manifest");

  // The final line: full bar, the average rate since the start, the time, and a newline.
  clock.Set(10000);
  progress.Finish(10 * kMiB);
  EXPECT_THAT(Frames(err.str()).back(),
              HasSubstr("publish done [################] 100%  10.0 MiB  1.0 MiB/s  in 10.0 s"));
  EXPECT_EQ(err.str().back(), '\n');
  const std::string finished = err.str();
  progress.Finish(10 * kMiB);
  progress.Stop();
  progress.Update("hashing", kMiB, 10 * kMiB);
  EXPECT_EQ(err.str(), finished) << "nothing after the final line";
}

TEST(ProgressTest, TerminalLinesDoNotWrapOnEightyColumns) {
  FakeClock clock;
  std::ostringstream err;
  ProgressRenderer progress(err, ProgressMode::kTerminal, "publish", &clock);
  const uint64_t total = 1023 * kMiB + 900 * 1024;
  progress.Update("exporting", 0, total);
  clock.Set(1000);
  progress.Update("exporting", 1000 * 1024, total);  // the widest numbers: 89 columns
  std::string line = Frames(err.str()).back();
  EXPECT_EQ(line.size(), kTerminalLineMax) << line;
  EXPECT_EQ(line.rfind("publish exporting [----------------]   0%  1000.0 KiB/1023.9 MiB  ", 0), 0u)
      << line;
}

TEST(ProgressTest, TerminalStopEndsTheLineAsItStands) {
  FakeClock clock;
  std::ostringstream err;
  {
    ProgressRenderer progress(err, ProgressMode::kTerminal, "fetch", &clock);
    progress.Update("fetching", kMiB, 4 * kMiB);
    progress.Stop();
    EXPECT_THAT(err.str(), HasSubstr("25%"));
    EXPECT_EQ(err.str().back(), '\n');
    progress.Finish(4 * kMiB);
    EXPECT_THAT(err.str(), Not(HasSubstr("done")));
  }
  // The destructor ends a line left open.
  std::ostringstream open;
  {
    ProgressRenderer progress(open, ProgressMode::kTerminal, "fetch", &clock);
    progress.Update("fetching", kMiB, 4 * kMiB);
    EXPECT_NE(open.str().back(), '\n');
  }
  EXPECT_EQ(open.str().back(), '\n');
  // Nothing drawn, nothing to end.
  std::ostringstream quiet;
  { ProgressRenderer progress(quiet, ProgressMode::kTerminal, "fetch", &clock); }
  EXPECT_EQ(quiet.str(), "");
}

TEST(ProgressTest, PlainWritesALineEveryFewSecondsAndEachPhase) {
  FakeClock clock;
  std::ostringstream err;
  ProgressRenderer progress(err, ProgressMode::kPlain, "fetch", &clock);
  progress.Update("manifest", 0, 0);
  clock.Set(200);
  progress.Update("fetching", 0, 8 * kMiB);
  for (int64_t t = 1000; t < 5200; t += 1000) {
    clock.Set(t);
    progress.Update("fetching", static_cast<uint64_t>(t / 1000) * kMiB, 8 * kMiB);
  }
  clock.Set(5200);
  progress.Update("fetching", 5 * kMiB, 8 * kMiB);
  clock.Set(6000);
  progress.Update("fetching", 6 * kMiB, 8 * kMiB);
  clock.Set(8000);
  progress.Finish(8 * kMiB);
  EXPECT_EQ(err.str().find('\r'), std::string::npos);
  EXPECT_THAT(
      Lines(err.str()),
      ::testing::ElementsAre("fetch: manifest", "fetch: fetching 0% 0 B / 8.0 MiB, --/s, ETA --:--",
                             // 5 s after the phase began: 5 MiB in 5 s, 3 MiB left.
                             "fetch: fetching 62% 5.0 MiB / 8.0 MiB, 1.0 MiB/s, ETA 0:03",
                             "fetch: done, 8.0 MiB in 8.0 s (1.0 MiB/s)"));
}

TEST(ProgressTest, JsonWritesOneObjectALineWithUnitsInNames) {
  FakeClock clock;
  std::ostringstream err;
  ProgressRenderer progress(err, ProgressMode::kJson, "publish", &clock);
  pb::ArtifactProgress p;
  p.set_phase("hashing");
  p.set_bytes_total(4 * kMiB);
  progress.Update(p);
  clock.Set(500);
  p.set_bytes_done(kMiB);
  progress.Update(p);  // within kJsonIntervalMs: not written
  clock.Set(1000);
  p.set_bytes_done(2 * kMiB);
  progress.Update(p);
  // The host's final message is left to Finish.
  clock.Set(1500);
  p.set_done(true);
  p.set_phase("done");
  p.set_bytes_done(4 * kMiB);
  progress.Update(p);
  clock.Set(2000);
  progress.Finish(4 * kMiB);

  std::vector<std::string> lines = Lines(err.str());
  ASSERT_EQ(lines.size(), 3u) << err.str();
  EXPECT_EQ(lines[0], R"({"operation":"publish","phase":"hashing","done":false,"bytes_done":0,)"
                      R"("bytes_total":4194304,"rate_bytes_per_s":0,"eta_s":null,"elapsed_ms":0})");
  nlohmann::json second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["bytes_done"], 2 * kMiB);
  EXPECT_EQ(second["rate_bytes_per_s"], 2 * kMiB);  // 2 MiB over the first second
  EXPECT_EQ(second["eta_s"], 1);
  EXPECT_EQ(second["elapsed_ms"], 1000);
  EXPECT_EQ(second["done"], false);
  nlohmann::json last = nlohmann::json::parse(lines[2]);
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["phase"], "done");
  EXPECT_EQ(last["bytes_done"], 4 * kMiB);
  EXPECT_EQ(last["bytes_total"], 4 * kMiB);
  EXPECT_EQ(last["rate_bytes_per_s"], 2 * kMiB);  // the average: 4 MiB in 2 s
  EXPECT_EQ(last["eta_s"], 0);
  EXPECT_EQ(last["elapsed_ms"], 2000);
}

TEST(ProgressTest, APhaseFromTheHostIsDrawnAsPrintableText) {
  FakeClock clock;
  std::ostringstream err;
  ProgressRenderer progress(err, ProgressMode::kPlain, "fetch", &clock);
  progress.Update("fetch\r\x1b[2Jing", 0, 0);
  EXPECT_EQ(err.str(), "fetch: fetch??[2Jing\n");
}

}  // namespace
}  // namespace ts::sidecar
