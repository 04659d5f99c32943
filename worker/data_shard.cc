#include "worker/data_shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/status.h"
#include "worker/bytes.h"

namespace ts::worker {
namespace {

using internal::ByteReader;
using internal::GetLe;
using internal::PutLe;

constexpr std::string_view kBatchDomain = "gonka-trainshard/v1/batch";

uint32_t TokenWidth(uint32_t vocab) { return vocab <= 65536 ? 2 : 4; }

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("data shard: ", what));
}

}  // namespace

std::string EncodeDataShard(const DataShard& shard) {
  TS_CHECK(shard.vocab >= 1);
  const uint32_t width = TokenWidth(shard.vocab);
  std::string out;
  out.reserve(kDataShardHeaderSize + shard.tokens.size() * width);
  out.append(kDataShardMagic, sizeof(kDataShardMagic));
  PutLe<uint32_t>(&out, kDataShardVersion);
  PutLe<uint32_t>(&out, width);
  PutLe<uint32_t>(&out, shard.vocab);
  PutLe<uint64_t>(&out, shard.tokens.size());
  TS_CHECK(out.size() == kDataShardHeaderSize);
  for (uint32_t t : shard.tokens) {
    TS_CHECK(t < shard.vocab);
    if (width == 2) {
      PutLe<uint16_t>(&out, static_cast<uint16_t>(t));
    } else {
      PutLe<uint32_t>(&out, t);
    }
  }
  return out;
}

absl::StatusOr<DataShard> DecodeDataShard(std::string_view bytes, uint64_t tokens_max) {
  ByteReader r(bytes);
  std::string_view magic;
  if (!r.ReadBytes(sizeof(kDataShardMagic), &magic) ||
      magic != std::string_view(kDataShardMagic, sizeof(kDataShardMagic))) {
    return Bad("wrong magic (not a trainshard data shard)");
  }
  uint32_t version = 0, width = 0, vocab = 0;
  uint64_t count = 0;
  if (!r.Read(&version) || !r.Read(&width) || !r.Read(&vocab) || !r.Read(&count)) {
    return Bad("truncated header");
  }
  if (version != kDataShardVersion) {
    return Bad(absl::StrCat("version ", version, " is not ", kDataShardVersion));
  }
  if (vocab < 1) return Bad("vocab 0");
  if (width != TokenWidth(vocab)) {
    return Bad(
        absl::StrCat("token width ", width, " is not ", TokenWidth(vocab), " for vocab ", vocab));
  }
  if (count > tokens_max) {
    return Bad(absl::StrCat(count, " tokens exceed the cap of ", tokens_max));
  }
  if (r.remaining() != count * width) {
    return Bad(absl::StrCat(r.remaining(), " bytes of tokens, expected ", count * width));
  }
  DataShard shard;
  shard.vocab = vocab;
  shard.tokens.resize(count);
  const char* p = bytes.data() + r.position();
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t t = width == 2 ? GetLe<uint16_t>(p + 2 * i) : GetLe<uint32_t>(p + 4 * i);
    if (t >= vocab) {
      return Bad(absl::StrCat("token[", i, "] = ", t, " is not below vocab ", vocab));
    }
    shard.tokens[i] = t;
  }
  return shard;
}

std::string DataShardId(std::string_view encoded) { return common::Sha256(encoded); }

absl::StatusOr<Assignment> AssignBatches(const AssignmentRequest& req) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("assignment: ", what));
  };
  if (req.steps == 0 || req.batch_size == 0 || req.context == 0) {
    return bad(absl::StrCat("steps ", req.steps, ", batch_size ", req.batch_size, ", context ",
                            req.context, " must all be positive"));
  }
  const uint64_t total = uint64_t{req.steps} * req.batch_size;
  if (total > kAssignmentWindowsMax) {
    return bad(absl::StrCat(total, " windows exceed the cap of ", kAssignmentWindowsMax));
  }
  if (req.shards.empty()) return bad("no shards");
  // prefix[i] = number of valid windows in shards [0, i).
  std::vector<uint64_t> prefix(req.shards.size() + 1, 0);
  for (size_t i = 0; i < req.shards.size(); ++i) {
    const uint64_t n = req.shards[i].tokens;
    const uint64_t windows = n > req.context ? n - req.context : 0;
    prefix[i + 1] = prefix[i] + windows;
  }
  const uint64_t windows_total = prefix.back();
  if (windows_total == 0) {
    return bad(absl::StrCat("no shard holds ", req.context + 1, " tokens"));
  }
  std::string prefix_bytes(kBatchDomain);
  PutLe<uint32_t>(&prefix_bytes, static_cast<uint32_t>(req.data_seed.size()));
  prefix_bytes.append(req.data_seed);
  PutLe<uint64_t>(&prefix_bytes, req.round);
  PutLe<uint32_t>(&prefix_bytes, static_cast<uint32_t>(req.host.size()));
  prefix_bytes.append(req.host);

  Assignment a;
  a.steps = req.steps;
  a.batch_size = req.batch_size;
  a.context = req.context;
  a.windows.reserve(total);
  std::string msg;
  for (uint64_t j = 0; j < total; ++j) {
    msg = prefix_bytes;
    PutLe<uint64_t>(&msg, j);
    const std::string digest = common::Sha256(msg);
    const uint64_t pick = GetLe<uint64_t>(digest.data()) % windows_total;
    // The shard whose range [prefix[i], prefix[i+1]) holds pick.
    const size_t i = static_cast<size_t>(std::upper_bound(prefix.begin(), prefix.end(), pick) -
                                         prefix.begin() - 1);
    a.windows.push_back(Window{static_cast<uint32_t>(i), pick - prefix[i]});
  }
  return a;
}

absl::StatusOr<std::vector<TokenBatch>> GatherBatches(const Assignment& a,
                                                      std::span<const DataShard> shards) {
  if (a.windows.size() != uint64_t{a.steps} * a.batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "assignment: ", a.windows.size(), " windows for ", a.steps, " steps of ", a.batch_size));
  }
  for (const DataShard& s : shards) {
    if (s.vocab != shards.front().vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("assignment: shards with vocab ", s.vocab, " and ", shards.front().vocab));
    }
  }
  const uint32_t cols = a.context + 1;
  std::vector<TokenBatch> batches(a.steps);
  for (uint32_t step = 0; step < a.steps; ++step) {
    TokenBatch& b = batches[step];
    b.rows = a.batch_size;
    b.cols = cols;
    b.tokens.reserve(uint64_t{b.rows} * cols);
    for (uint32_t row = 0; row < a.batch_size; ++row) {
      const Window& w = a.windows[uint64_t{step} * a.batch_size + row];
      if (w.shard >= shards.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("assignment: window shard ", w.shard, " of ", shards.size(), " shards"));
      }
      const std::vector<uint32_t>& tokens = shards[w.shard].tokens;
      if (w.offset > tokens.size() || tokens.size() - w.offset < cols) {
        return absl::InvalidArgumentError(absl::StrCat("assignment: window at ", w.offset,
                                                       " of shard ", w.shard, " (", tokens.size(),
                                                       " tokens) is shorter than ", cols));
      }
      b.tokens.insert(b.tokens.end(), tokens.begin() + static_cast<int64_t>(w.offset),
                      tokens.begin() + static_cast<int64_t>(w.offset + cols));
    }
  }
  return batches;
}

}  // namespace ts::worker
