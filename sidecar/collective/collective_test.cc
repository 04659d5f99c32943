// Collective operations over an in-memory mesh (the algorithms alone: reduction order,
// bit-identity, codecs, commitments, failures) and over the real TCP transport on loopback.
#include "sidecar/collective/collective.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/crypto/bech32.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sidecar/collective/tcp_transport.h"

namespace ts::sidecar {
namespace {

// ---------------------------------------------------------------------------------------------
// In-memory mesh: every member's links are queues in one hub. A failure or abort anywhere
// fails every member's mesh, as kAbort does over TCP.

class MemHub;

class MemLink final : public Link {
 public:
  MemLink(MemHub* hub, size_t from, size_t to, std::string peer)
      : hub_(hub), from_(from), to_(to), peer_(std::move(peer)) {}
  const std::string& peer() const override { return peer_; }
  absl::Status Send(const FrameHeader& header, std::string_view payload,
                    int64_t deadline_ms) override;
  absl::StatusOr<Frame> Recv(int64_t deadline_ms) override;
  void Recycle(std::string) override {}
  uint64_t bytes_sent() const override { return 0; }
  uint64_t bytes_received() const override { return 0; }

 private:
  MemHub* const hub_;
  const size_t from_;
  const size_t to_;
  const std::string peer_;
};

class MemHub {
 public:
  // Called for every frame sent; may change the payload (a corrupting member).
  using Tamper = std::function<void(size_t from, size_t to, FrameHeader*, std::string*)>;

  explicit MemHub(GroupSpec group) : group_(std::move(group)) {}
  const GroupSpec& group() const { return group_; }

  void set_tamper(Tamper tamper) { tamper_ = std::move(tamper); }

  // Every member's mesh fails, naming `member` as at fault.
  void Kill(size_t member) {
    Fail(PeerFailure(absl::StatusCode::kUnavailable, group_.members[member].address,
                     "connection closed"));
  }
  void Fail(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = status;
  }
  absl::Status failure() {
    absl::MutexLock lock(&mu_);
    return failure_;
  }

  absl::Status Send(size_t from, size_t to, const FrameHeader& header, std::string_view payload) {
    Frame frame;
    frame.header = header;
    frame.header.payload_size = static_cast<uint32_t>(payload.size());
    frame.payload.assign(payload);
    if (tamper_) tamper_(from, to, &frame.header, &frame.payload);
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    queues_[{from, to}].push_back(std::move(frame));
    return absl::OkStatus();
  }

  absl::StatusOr<Frame> Recv(size_t from, size_t to) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !failure_.ok() || !queues_[{from, to}].empty();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(20))) {
      return PeerFailure(absl::StatusCode::kDeadlineExceeded, group_.members[from].address,
                         "no data");
    }
    if (!failure_.ok()) return failure_;
    Frame frame = std::move(queues_[{from, to}].front());
    queues_[{from, to}].pop_front();
    return frame;
  }

 private:
  const GroupSpec group_;
  Tamper tamper_;
  absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<size_t, size_t>, std::deque<Frame>> queues_ ABSL_GUARDED_BY(mu_);
};

absl::Status MemLink::Send(const FrameHeader& header, std::string_view payload, int64_t) {
  return hub_->Send(from_, to_, header, payload);
}
absl::StatusOr<Frame> MemLink::Recv(int64_t) { return hub_->Recv(to_, from_); }

class MemMesh final : public Mesh {
 public:
  MemMesh(MemHub* hub, size_t self) : hub_(hub), self_(self) {
    for (size_t i = 0; i < hub->group().members.size(); ++i) {
      links_.push_back(std::make_unique<MemLink>(hub, self, i, hub->group().members[i].address));
    }
  }
  const GroupSpec& group() const override { return hub_->group(); }
  size_t self_index() const override { return self_; }
  Link* link(size_t member_index) override { return links_[member_index].get(); }
  absl::Status failure() const override { return hub_->failure(); }
  void Abort(const absl::Status& status) override { hub_->Fail(status); }

 private:
  MemHub* const hub_;
  const size_t self_;
  std::vector<std::unique_ptr<MemLink>> links_;
};

// ---------------------------------------------------------------------------------------------

struct Members {
  std::vector<common::PrivateKey> keys;
  GroupSpec group;
};

Members MakeMembers(size_t n) {
  Members m;
  m.group.shard_id = 7;
  m.group.session = 1;
  for (size_t i = 0; i < n; ++i) {
    m.keys.push_back(common::PrivateKey::Generate());
    m.group.members.push_back({common::AddressFromPublicKey(m.keys.back().public_key()),
                               absl::StrCat("127.0.0.1:", 1000 + i)});
  }
  return m;
}

std::vector<std::vector<float>> RandomInputs(size_t n, size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> inputs(n, std::vector<float>(elements));
  for (auto& v : inputs)
    for (float& x : v) x = dist(rng);
  return inputs;
}

// The documented order: segment j summed as x_j + x_{j+1} + … + x_{j+n−1}, then / n for mean.
std::vector<float> ReferenceRing(const std::vector<std::vector<float>>& inputs, bool mean) {
  const size_t n = inputs.size();
  const size_t count = inputs[0].size();
  std::vector<float> out(count);
  for (size_t j = 0; j < n; ++j) {
    size_t begin = count * j / n, end = count * (j + 1) / n;
    for (size_t e = begin; e < end; ++e) {
      float acc = inputs[j][e];
      for (size_t k = 1; k < n; ++k) acc = acc + inputs[(j + k) % n][e];
      out[e] = mean ? acc / static_cast<float>(n) : acc;
    }
  }
  return out;
}

OpOptions Options(Compression kind, ReduceOp reduce, uint32_t chunk_elements) {
  OpOptions o;
  o.op_id = 42;
  o.codec.kind = kind;
  o.reduce = reduce;
  o.deadline_ms = common::SystemClock().MonotonicMs() + 30000;
  o.chunk_elements = chunk_elements;
  return o;
}

// Runs `op` on every member of an in-memory mesh, one thread each.
std::vector<absl::Status> RunAll(MemHub* hub, const Members& m,
                                 const std::function<absl::Status(Collective&, size_t)>& op) {
  const size_t n = m.group.members.size();
  std::vector<absl::Status> results(n);
  std::vector<std::unique_ptr<MemMesh>> meshes;
  for (size_t i = 0; i < n; ++i) meshes.push_back(std::make_unique<MemMesh>(hub, i));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Collective collective(meshes[i].get(), &m.keys[i], "test-chain", &common::SystemClock());
      results[i] = op(collective, i);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CollectiveMem, AllReduceFp32MatchesReferenceBitForBit) {
  for (size_t n : {2, 3, 4, 5}) {
    for (size_t elements : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}, size_t{100003}}) {
      for (ReduceOp reduce : {ReduceOp::kSum, ReduceOp::kMean}) {
        SCOPED_TRACE(absl::StrCat("n=", n, " elements=", elements));
        Members m = MakeMembers(n);
        MemHub hub(m.group);
        auto inputs = RandomInputs(n, elements, static_cast<uint32_t>(n * 7919 + elements));
        auto data = inputs;
        auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
          return c.AllReduce(Options(Compression::kFp32, reduce, 64), data[i]).status();
        });
        auto reference = ReferenceRing(inputs, reduce == ReduceOp::kMean);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(results[i].ok()) << results[i];
          EXPECT_TRUE(SameBits(data[i], reference)) << "member " << i;
        }
      }
    }
  }
}

TEST(CollectiveMem, LossyCodecsBitIdenticalAndCloseToMean) {
  const size_t n = 4, elements = 50000;
  for (Compression kind : {Compression::kFp16, Compression::kBf16, Compression::kInt8,
                           Compression::kTopK, Compression::kInt8Zstd}) {
    SCOPED_TRACE(CompressionName(kind));
    Members m = MakeMembers(n);
    MemHub hub(m.group);
    auto inputs = RandomInputs(n, elements, 5);
    auto data = inputs;
    OpStats stats0;
    auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
      auto stats = c.AllReduce(Options(kind, ReduceOp::kMean, 4096), data[i]);
      if (stats.ok() && i == 0) stats0 = *stats;
      return stats.status();
    });
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(results[i].ok()) << results[i];
    for (size_t i = 1; i < n; ++i) EXPECT_TRUE(SameBits(data[0], data[i])) << "member " << i;
    auto exact = ReferenceRing(inputs, /*mean=*/true);
    double err = 0, norm = 0;
    for (size_t e = 0; e < elements; ++e) {
      err += (data[0][e] - exact[e]) * (data[0][e] - exact[e]);
      norm += exact[e] * exact[e];
    }
    // Dense codecs re-quantize along the ring; the relative error stays small. Top-k keeps
    // 1.56 % of each contribution, so only that much of the signal gets through.
    if (kind == Compression::kTopK) {
      EXPECT_LT(stats0.payload_bytes_sent * 20, stats0.raw_bytes);
    } else {
      const bool int8 = kind == Compression::kInt8 || kind == Compression::kInt8Zstd;
      EXPECT_LT(std::sqrt(err / norm), int8 ? 0.02 : 0.01);
      EXPECT_LT(stats0.payload_bytes_sent, stats0.raw_bytes);
    }
  }
}

std::vector<std::vector<float>> NormalInputs(size_t n, size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<float>> inputs(n, std::vector<float>(elements));
  for (size_t i = 0; i < n; ++i) {
    std::normal_distribution<float> dist(0.0f, 0.01f * static_cast<float>(i + 1));
    for (float& x : inputs[i]) x = dist(rng);
  }
  return inputs;
}

// A zstd codec's entropy stage is lossless at every hop, so the ring gives the bits of the codec
// without it (`plain`) exactly, in fewer bytes on the wire: at most `ratio_max` of them.
void ExpectPlainBitsInFewerBytes(Compression plain, Compression zstd, double ratio_max) {
  SCOPED_TRACE(CompressionName(zstd));
  const size_t n = 4, elements = 300000;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  const auto inputs = NormalInputs(n, elements, 23);
  std::map<Compression, std::vector<std::vector<float>>> out;
  std::map<Compression, uint64_t> bytes;
  for (Compression kind : {plain, zstd}) {
    auto data = inputs;
    std::vector<uint64_t> sent(n);
    auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
      OpOptions o = Options(kind, ReduceOp::kMean, 65536);
      o.op_id = 50 + static_cast<uint64_t>(kind);
      auto stats = c.AllReduce(o, data[i]);
      if (stats.ok()) sent[i] = stats->payload_bytes_sent;
      return stats.status();
    });
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(results[i].ok()) << results[i];
    for (size_t i = 0; i < n; ++i) bytes[kind] += sent[i];
    out[kind] = std::move(data);
  }
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(SameBits(out[plain][i], out[zstd][i])) << i;
  const double ratio = static_cast<double>(bytes[zstd]) / static_cast<double>(bytes[plain]);
  std::printf("ring %s: %llu of %s's %llu payload bytes (%.4f)\n",
              std::string(CompressionName(zstd)).c_str(),
              static_cast<unsigned long long>(bytes[zstd]),
              std::string(CompressionName(plain)).c_str(),
              static_cast<unsigned long long>(bytes[plain]), ratio);
  EXPECT_LT(ratio, ratio_max);
}

TEST(CollectiveMem, Int8ZstdGivesInt8sBitsInFewerBytes) {
  ExpectPlainBitsInFewerBytes(Compression::kInt8, Compression::kInt8Zstd, 0.95);
}

// fp32-zstd carries fp32's bits: the result is the fixed-order reference, bit for bit, on every
// member, in fewer bytes (Gaussian partial sums: about 0.85 of fp32's).
TEST(CollectiveMem, Fp32ZstdGivesFp32sBitsInFewerBytes) {
  ExpectPlainBitsInFewerBytes(Compression::kFp32, Compression::kFp32Zstd, 0.9);
  for (size_t n : {2, 3, 5}) {
    for (size_t elements : {size_t{1}, size_t{7}, size_t{100003}}) {
      SCOPED_TRACE(absl::StrCat("n=", n, " elements=", elements));
      Members m = MakeMembers(n);
      MemHub hub(m.group);
      const auto inputs = NormalInputs(n, elements, static_cast<uint32_t>(n + elements));
      auto data = inputs;
      auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
        return c.AllReduce(Options(Compression::kFp32Zstd, ReduceOp::kMean, 4096), data[i])
            .status();
      });
      const auto reference = ReferenceRing(inputs, /*mean=*/true);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(results[i].ok()) << results[i];
        EXPECT_TRUE(SameBits(data[i], reference)) << "member " << i;
      }
    }
  }
}

// Robust allreduce gathers contributions of different sizes (an all-zero one is a few bytes):
// the result is what int8's would be, the same on every member.
TEST(CollectiveMem, RobustWithInt8ZstdContributionsOfDifferentSizes) {
  const size_t n = 4, elements = 20000;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  auto inputs = NormalInputs(n, elements, 29);
  std::fill(inputs[3].begin(), inputs[3].end(), 0.0f);
  AggregateSpec spec;
  spec.kind = Aggregator::kMedian;
  std::map<Compression, std::vector<std::vector<float>>> out;
  for (Compression kind : {Compression::kInt8, Compression::kInt8Zstd}) {
    auto data = inputs;
    auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
      OpOptions o = Options(kind, ReduceOp::kMean, 4096);
      o.op_id = 60 + static_cast<uint64_t>(kind);
      return c.RobustAllReduce(o, spec, data[i]).status();
    });
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(results[i].ok()) << results[i];
    out[kind] = std::move(data);
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(SameBits(out[Compression::kInt8][0], out[Compression::kInt8Zstd][i])) << i;
  }
}

// A robust allreduce (trimmed mean) of `inputs` among `n` members while `tamper` alters frames in
// transit: every member but 1 fails naming member 1, with `message`. (Member 1 itself holds its
// true bytes and may finish before the aborts reach it.)
void ExpectRobustBlamesMember1(size_t n, Compression kind,
                               const std::vector<std::vector<float>>& inputs, MemHub::Tamper tamper,
                               const std::string& message) {
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  hub.set_tamper(std::move(tamper));
  auto data = inputs;
  AggregateSpec spec;
  spec.kind = Aggregator::kTrimmedMean;
  auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
    return c.RobustAllReduce(Options(kind, ReduceOp::kMean, 512), spec, data[i]).status();
  });
  for (size_t i = 0; i < n; ++i) {
    if (i == 1) continue;
    ASSERT_FALSE(results[i].ok()) << i;
    EXPECT_EQ(FailedPeerOf(results[i]), m.group.members[1].address) << results[i];
    EXPECT_THAT(results[i].message(), testing::HasSubstr(message));
  }
}

// A contribution size outside the codec's bound, announced with the commitment, is refused
// naming the member before any contribution is revealed.
TEST(CollectiveMem, AnnouncedContributionSizeOutOfBoundsIsNamed) {
  // Member 1's own commit block (32 + 65 + 8 bytes) opens its first frame.
  ExpectRobustBlamesMember1(
      3, Compression::kInt8Zstd, NormalInputs(3, 5000, 31),
      [](size_t from, size_t, FrameHeader* h, std::string* payload) {
        if (from == 1 && h->step == 0 && payload->size() >= 105) {
          PutU64(payload->data() + 97, 1u << 30);
        }
      },
      "announced as 1073741824 bytes");
}

TEST(CollectiveMem, TopKEqualsMeanOfDecodedContributions) {
  const size_t n = 3, elements = 10000;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  auto inputs = RandomInputs(n, elements, 11);
  auto data = inputs;
  auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
    return c.AllReduce(Options(Compression::kTopK, ReduceOp::kSum, 4096), data[i]).status();
  });
  CodecSpec spec;
  spec.kind = Compression::kTopK;
  std::vector<float> expected(elements, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i];
    std::string bytes;
    ASSERT_TRUE(Encode(spec, inputs[i], &bytes).ok());
    ASSERT_TRUE(DecodeAdd(spec, bytes, expected).ok());
  }
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(SameBits(data[i], expected));
}

TEST(CollectiveMem, AllGatherAndBf16) {
  const size_t n = 5;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  std::vector<std::string> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = std::string(1001, static_cast<char>('a' + i));
  std::vector<std::vector<char>> out(n, std::vector<char>(n * 1001));
  auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
    return c.AllGather(Options(Compression::kFp32, ReduceOp::kSum, 100), mine[i], out[i]).status();
  });
  std::string expected;
  for (auto& s : mine) expected += s;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i];
    EXPECT_EQ(std::string(out[i].begin(), out[i].end()), expected);
  }

  MemHub hub2(m.group);
  auto inputs = RandomInputs(n, 999, 3);
  std::vector<std::vector<uint16_t>> bf(n, std::vector<uint16_t>(999));
  for (size_t i = 0; i < n; ++i)
    for (size_t e = 0; e < 999; ++e) bf[i][e] = FloatToBf16(inputs[i][e]);
  results = RunAll(&hub2, m, [&](Collective& c, size_t i) {
    return c.AllReduceBf16(Options(Compression::kFp32, ReduceOp::kMean, 128), bf[i]).status();
  });
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i];
    EXPECT_EQ(bf[i], bf[0]);
  }
  for (size_t e = 0; e < 999; ++e) {
    float mean = 0;
    for (size_t i = 0; i < n; ++i) mean += Bf16ToFloat(FloatToBf16(inputs[i][e]));
    mean /= n;
    EXPECT_NEAR(Bf16ToFloat(bf[0][e]), mean, 0.02f) << e;
  }
}

TEST(CollectiveMem, RobustMedianResistsScaledAttacker) {
  const size_t n = 4, elements = 2000;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  auto inputs = RandomInputs(n, elements, 17);
  for (float& x : inputs[2]) x *= 100.0f;  // the attacker
  auto data = inputs;
  AggregateSpec spec;
  spec.kind = Aggregator::kMedian;
  auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
    return c.RobustAllReduce(Options(Compression::kFp32, ReduceOp::kMean, 512), spec, data[i])
        .status();
  });
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(results[i].ok()) << results[i];
  for (size_t i = 1; i < n; ++i) EXPECT_TRUE(SameBits(data[0], data[i]));
  for (size_t e = 0; e < elements; ++e) EXPECT_LE(std::fabs(data[0][e]), 1.0f) << e;
}

TEST(CollectiveMem, RevealThatBreaksItsCommitmentIsNamed) {
  // Member 1 changes its contribution after committing: its reveal frames are altered.
  ExpectRobustBlamesMember1(
      4, Compression::kFp32, RandomInputs(4, 300, 19),
      [](size_t from, size_t, FrameHeader* h, std::string* payload) {
        if (from == 1 && h->step == (1u << 16) && !payload->empty()) (*payload)[0] ^= 1;
      },
      "does not match its commitment");
}

TEST(CollectiveMem, KilledMemberIsNamedAndSurvivorsSucceed) {
  const size_t n = 4;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  auto inputs = RandomInputs(n, 100000, 23);
  auto data = inputs;
  auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
    if (i == 2) {
      hub.Kill(2);
      return absl::UnavailableError("killed");
    }
    return c.AllReduce(Options(Compression::kFp32, ReduceOp::kMean, 1000), data[i]).status();
  });
  for (size_t i : {0, 1, 3}) {
    ASSERT_FALSE(results[i].ok());
    EXPECT_EQ(FailedPeerOf(results[i]), m.group.members[2].address) << results[i];
  }
  // Retry with the survivors on a new mesh.
  Members survivors;
  survivors.group = m.group;
  survivors.group.session = 2;
  survivors.group.members.erase(survivors.group.members.begin() + 2);
  survivors.keys = {m.keys[0], m.keys[1], m.keys[3]};
  std::vector<std::vector<float>> kept = {inputs[0], inputs[1], inputs[3]};
  auto again = kept;
  MemHub hub2(survivors.group);
  results = RunAll(&hub2, survivors, [&](Collective& c, size_t i) {
    return c.AllReduce(Options(Compression::kFp32, ReduceOp::kMean, 1000), again[i]).status();
  });
  auto reference = ReferenceRing(kept, /*mean=*/true);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i];
    EXPECT_TRUE(SameBits(again[i], reference));
  }
}

TEST(CollectiveMem, WrongSizedOrForeignFramesAreNamed) {
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode);
    const size_t n = 4;
    Members m = MakeMembers(n);
    MemHub hub(m.group);
    // Member 3's second data frame is one byte longer, names another operation, or another step.
    int sent = 0;
    hub.set_tamper([&, mode](size_t from, size_t, FrameHeader* h, std::string* payload) {
      if (from != 3 || ++sent != 2) return;
      if (mode == 0) payload->push_back('x');
      if (mode == 1) h->op_id += 1;
      if (mode == 2) h->step += 1;
    });
    auto data = RandomInputs(n, 20000, 37);
    auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
      return c.AllReduce(Options(Compression::kFp32, ReduceOp::kMean, 1024), data[i]).status();
    });
    for (size_t i = 0; i < n; ++i) {
      ASSERT_FALSE(results[i].ok()) << i;
      EXPECT_EQ(FailedPeerOf(results[i]), m.group.members[3].address) << results[i];
    }
  }
}

TEST(CollectiveMem, NonFiniteInputBlamesItsOwner) {
  const size_t n = 3;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  auto data = RandomInputs(n, 100, 29);
  data[1][50] = std::nanf("");
  auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
    return c.AllReduce(Options(Compression::kFp32, ReduceOp::kMean, 16), data[i]).status();
  });
  for (size_t i = 0; i < n; ++i) {
    ASSERT_FALSE(results[i].ok());
    EXPECT_EQ(FailedPeerOf(results[i]), m.group.members[1].address) << results[i];
  }
}

TEST(CollectiveMem, MeasuredRingOrderIsTheSameOnEveryMember) {
  const size_t n = 4;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  std::vector<std::vector<size_t>> orders(n);
  std::vector<std::vector<std::vector<double>>> rates(n);
  auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
    auto order = c.MeasureRingOrder(Options(Compression::kFp32, ReduceOp::kMean, 4096),
                                    /*probe_bytes=*/1 << 20, &rates[i]);
    if (order.ok()) orders[i] = *order;
    return order.status();
  });
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i];
    EXPECT_EQ(orders[i], orders[0]);
    EXPECT_EQ(rates[i], rates[0]);
  }
  std::vector<size_t> sorted = orders[0];
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(orders[0][0], 0u);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i != j) {
        EXPECT_GT(rates[0][i][j], 0.0) << i << "->" << j;
      }
    }
  }
}

TEST(CollectiveMem, MinimumOfIsTheSameOnEveryMember) {
  const size_t n = 3;
  Members m = MakeMembers(n);
  MemHub hub(m.group);
  // Values past 2^32 and differing only in high bytes check the wire encoding.
  const std::vector<uint64_t> values = {(uint64_t{7} << 40) + 5, (uint64_t{3} << 40) + 9,
                                        (uint64_t{3} << 40) + 11};
  std::vector<uint64_t> got(n);
  auto results = RunAll(&hub, m, [&](Collective& c, size_t i) {
    auto least = c.MinimumOf(Options(Compression::kFp32, ReduceOp::kMean, 4096), values[i]);
    if (least.ok()) got[i] = *least;
    return least.status();
  });
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i];
    EXPECT_EQ(got[i], (uint64_t{3} << 40) + 9) << "member " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// The same operations over the real TCP transport on loopback.

TEST(CollectiveTcp, AllReduceAndRobustOverLoopback) {
  const size_t n = 3;
  std::vector<common::PrivateKey> keys;
  std::vector<std::unique_ptr<TcpTransport>> transports;
  GroupSpec group;
  group.shard_id = 9;
  group.session = 1;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back(common::PrivateKey::Generate());
    TcpTransportOptions options;
    options.chain_id = "test-chain";
    options.heartbeat_interval_ms = 200;
    auto t = TcpTransport::Start(keys.back(), options, &common::SystemClock());
    ASSERT_TRUE(t.ok()) << t.status();
    group.members.push_back({(*t)->address(), (*t)->endpoint()});
    transports.push_back(std::move(*t));
  }
  auto inputs = RandomInputs(n, 300001, 31);
  auto data = inputs;
  auto robust = inputs;
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto deadline = common::SystemClock().MonotonicMs() + 30000;
      auto mesh = transports[i]->Connect(group, i, deadline);
      if (!mesh.ok()) {
        results[i] = mesh.status();
        return;
      }
      Collective c(mesh->get(), &keys[i], "test-chain", &common::SystemClock());
      OpOptions o = Options(Compression::kFp32, ReduceOp::kMean, 8192);
      results[i] = c.AllReduce(o, data[i]).status();
      if (!results[i].ok()) return;
      o.op_id = 43;
      AggregateSpec spec;
      spec.kind = Aggregator::kCenteredClip;
      results[i] = c.RobustAllReduce(o, spec, robust[i]).status();
    });
  }
  for (auto& t : threads) t.join();
  auto reference = ReferenceRing(inputs, /*mean=*/true);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i];
    EXPECT_TRUE(SameBits(data[i], reference)) << i;
    EXPECT_TRUE(SameBits(robust[i], robust[0])) << i;
  }
}

}  // namespace
}  // namespace ts::sidecar
