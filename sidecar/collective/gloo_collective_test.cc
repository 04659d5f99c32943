#include "sidecar/collective/gloo_collective.h"

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/temp_dir.h"

namespace ts::sidecar {
namespace {

using ts::test_util::TempDir;

GlooOptions Options(const TempDir& dir, int rank, int size) {
  GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.store_dir = dir.str();
  o.prefix = "test";
  o.bind_ip = "127.0.0.1";
  o.timeout_ms = 10000;
  return o;
}

// Runs `body(rank, collective)` on `size` threads, each one rank of one group on loopback.
// Every rank is connected before any body runs, and every body is done before any rank closes:
// Gloo's Connect returns on one rank while its peer may still be finishing the same pair's
// handshake, and a rank that closed early (a body that fails at once, as the refusal tests'
// do) would break that handshake.
void RunGroup(int size, const std::function<void(int, GlooCollective&)>& body) {
  TempDir dir("gloo-store-");
  std::barrier sync(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      auto c = GlooCollective::Connect(Options(dir, rank, size));
      if (!c.ok()) {
        ADD_FAILURE() << "rank " << rank << ": " << c.status();
        sync.arrive_and_drop();
        return;
      }
      sync.arrive_and_wait();
      body(rank, **c);
      sync.arrive_and_wait();
    });
  }
  for (auto& t : threads) t.join();
}

// Deterministic values in [-1, 1) that differ per rank and index (a 64-bit LCG).
std::vector<float> Input(int rank, size_t n) {
  std::vector<float> v(n);
  uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1);
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = static_cast<float>(static_cast<double>(s >> 40) / static_cast<double>(1ull << 23)) - 1;
  }
  return v;
}

// Exact sum in double of every rank's input (an independent reference), and sum of |x|.
void Reference(int size, size_t n, std::vector<double>& sum, std::vector<double>& abs_sum) {
  sum.assign(n, 0);
  abs_sum.assign(n, 0);
  for (int r = 0; r < size; ++r) {
    std::vector<float> in = Input(r, n);
    for (size_t i = 0; i < n; ++i) {
      sum[i] += in[i];
      abs_sum[i] += std::fabs(in[i]);
    }
  }
}

void CheckAllReduce(int size, size_t n, bool mean) {
  std::vector<std::vector<float>> results(size);
  RunGroup(size, [&](int rank, GlooCollective& c) {
    std::vector<float> data = Input(rank, n);
    ASSERT_TRUE(c.AllReduce(data, mean).ok());
    results[rank] = std::move(data);
  });
  std::vector<double> sum, abs_sum;
  Reference(size, n, sum, abs_sum);
  const double scale = mean ? 1.0 / size : 1.0;
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(results[r].size(), n) << "rank " << r;
    // Float sums of `size` terms in some order: relative error below size * 2^-24 of sum |x|.
    for (size_t i = 0; i < n; ++i) {
      const double tol = (abs_sum[i] * size * 0x1p-23 + 1e-30) * scale;
      ASSERT_NEAR(results[r][i], sum[i] * scale, tol) << "rank " << r << " index " << i;
    }
    // Gloo's ring reduces each segment on one member and passes the result on: every member
    // holds the same bits.
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), n * sizeof(float)), 0)
        << "rank " << r;
  }
}

TEST(GlooCollective, AllReduceSumMatchesReference) {
  for (int size : {2, 3, 4}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{300007}}) {
      SCOPED_TRACE(testing::Message() << size << " ranks, " << n << " floats");
      CheckAllReduce(size, n, /*mean=*/false);
    }
  }
}

TEST(GlooCollective, AllReduceMeanMatchesReference) {
  for (int size : {2, 4}) {
    SCOPED_TRACE(testing::Message() << size << " ranks");
    CheckAllReduce(size, 1 << 20, /*mean=*/true);  // 4 MiB: several of Gloo's 1 MiB segments
  }
}

TEST(GlooCollective, AllGatherIsExact) {
  for (int size : {2, 3, 4}) {
    for (size_t n : {size_t{1}, size_t{5}, size_t{100003}}) {
      SCOPED_TRACE(testing::Message() << size << " ranks, " << n << " floats each");
      std::vector<std::vector<float>> results(size);
      RunGroup(size, [&](int rank, GlooCollective& c) {
        std::vector<float> mine = Input(rank, n);
        std::vector<float> out(n * size, -7.0f);
        ASSERT_TRUE(c.AllGather(mine, out).ok());
        results[rank] = std::move(out);
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(results[r].size(), n * size);
        for (int from = 0; from < size; ++from) {
          std::vector<float> want = Input(from, n);
          EXPECT_EQ(std::memcmp(results[r].data() + from * n, want.data(), n * sizeof(float)), 0)
              << "rank " << r << ", block of rank " << from;
        }
      }
    }
  }
}

TEST(GlooCollective, OperationsInSequenceAndEmptyBuffers) {
  RunGroup(3, [](int rank, GlooCollective& c) {
    std::vector<float> empty;
    EXPECT_TRUE(c.AllReduce(empty, /*mean=*/false).ok());
    std::vector<float> none_out;
    EXPECT_TRUE(c.AllGather(empty, none_out).ok());
    for (int round = 0; round < 5; ++round) {
      std::vector<float> data(1000, static_cast<float>(rank + round));
      ASSERT_TRUE(c.AllReduce(data, /*mean=*/true).ok());
      for (float x : data) ASSERT_EQ(x, static_cast<float>(1 + round)) << "round " << round;
      std::vector<float> mine{static_cast<float>(rank * 10 + round)};
      std::vector<float> out(3);
      ASSERT_TRUE(c.AllGather(mine, out).ok());
      for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r], static_cast<float>(r * 10 + round));
    }
  });
}

TEST(GlooCollective, AllGatherRefusesWrongOutputSize) {
  RunGroup(2, [](int rank, GlooCollective& c) {
    std::vector<float> mine(4, 1.0f);
    std::vector<float> out(7);
    absl::Status s = c.AllGather(mine, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("out has 7 floats"), std::string::npos) << s;
  });
}

TEST(GlooCollective, RefusesBadOptions) {
  TempDir dir("gloo-store-");
  struct Case {
    std::function<void(GlooOptions&)> change;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](GlooOptions& o) { o.size = 1; }, "size 1"},
      {[](GlooOptions& o) { o.size = 0; }, "size 0"},
      {[](GlooOptions& o) { o.rank = -1; }, "rank -1"},
      {[](GlooOptions& o) { o.rank = 2; }, "rank 2"},
      {[](GlooOptions& o) { o.store_dir.clear(); }, "store_dir"},
      {[](GlooOptions& o) { o.bind_ip.clear(); }, "bind_ip"},
      {[](GlooOptions& o) { o.timeout_ms = 0; }, "timeout_ms 0"},
  };
  for (const Case& c : cases) {
    GlooOptions o = Options(dir, 0, 2);
    c.change(o);
    auto got = GlooCollective::Connect(o);
    ASSERT_FALSE(got.ok()) << c.field;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_NE(got.status().message().find(c.field), std::string::npos) << got.status();
  }
}

TEST(GlooCollective, BindIpMustBeAnAddressOfThisHost) {
  TempDir dir("gloo-store-");
  GlooOptions o = Options(dir, 0, 2);
  o.bind_ip = "no-such-host.invalid";
  auto got = GlooCollective::Connect(o);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find("bind_ip \"no-such-host.invalid\""), std::string::npos)
      << got.status();
  o.bind_ip = "192.0.2.1";  // TEST-NET-1: on no interface here
  got = GlooCollective::Connect(o);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_NE(got.status().message().find("bind_ip 192.0.2.1: bind"), std::string::npos)
      << got.status();
}

TEST(GlooCollective, RendezvousTimesOutWhenAMemberNeverComes) {
  TempDir dir("gloo-store-");
  GlooOptions o = Options(dir, 0, 2);
  o.timeout_ms = 300;  // Gloo's FileStore checks its deadline in whole seconds: about 1 s here
  auto got = GlooCollective::Connect(o);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_NE(got.status().message().find("rendezvous"), std::string::npos) << got.status();
}

TEST(GlooCollective, CreatesTheStoreDirectory) {
  TempDir dir("gloo-store-");
  const std::string nested = (dir.path() / "a" / "b").string();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions o = Options(dir, rank, 2);
      o.store_dir = nested;
      auto c = GlooCollective::Connect(o);
      ASSERT_TRUE(c.ok()) << c.status();
      std::vector<float> data{1.0f, 2.0f};
      ASSERT_TRUE((*c)->AllReduce(data, /*mean=*/false).ok());
      EXPECT_EQ(data, (std::vector<float>{2.0f, 4.0f}));
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GlooCollective, PeerGoneFailsTheOperation) {
  TempDir dir("gloo-store-");
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<GlooCollective>> members(2);
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions o = Options(dir, rank, 2);
      o.timeout_ms = 5000;
      auto c = GlooCollective::Connect(o);
      ASSERT_TRUE(c.ok()) << c.status();
      members[rank] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(members[0] && members[1]);
  members[1].reset();  // closes its connections
  std::vector<float> data(1 << 16, 1.0f);
  absl::Status s = members[0]->AllReduce(data, /*mean=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("gloo allreduce"), std::string::npos) << s;
}

}  // namespace
}  // namespace ts::sidecar
