// An in-memory ChainClient for the host sidecar's unit tests only: scripted events per height,
// one account with a sequence the fake checks like a chain's mempool would, blocks made on
// demand, and switches that make calls fail. Signatures in the txs it receives are real; the
// fake decodes them with the real DecodeTx.
//
// Thread-safety: thread-safe (one mutex), as ChainClient requires.
#ifndef TS_SIDECAR_HOST_FAKE_CHAIN_CLIENT_H_
#define TS_SIDECAR_HOST_FAKE_CHAIN_CLIENT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/module/tx.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "common/status.h"

namespace ts::sidecar::testing {

namespace pb = ::gonka::trainshard::v1;
using cosmos::base::abci::v1beta1::TxResponse;

inline tendermint::abci::Event MakeEvent(
    std::string type, const std::vector<std::pair<std::string, std::string>>& attributes) {
  tendermint::abci::Event event;
  event.set_type(std::move(type));
  for (const auto& [k, v] : attributes) {
    auto* a = event.add_attributes();
    a->set_key(k);
    a->set_value(v);
  }
  return event;
}

// A clock that moves only when told.
class FakeClock final : public common::Clock {
 public:
  int64_t NowUnixMs() override { return 1'700'000'000'000 + now_ms_; }
  int64_t MonotonicMs() override { return now_ms_; }
  void SleepMs(int64_t ms) override { now_ms_ += ms; }
  void Advance(int64_t ms) { now_ms_ += ms; }

 private:
  int64_t now_ms_ = 1000;
};

// A fixed test key: 32 bytes of `byte`.
inline common::PrivateKey KeyOf(char byte) {
  auto key = common::PrivateKey::FromBytes(std::string(32, byte));
  TS_CHECK(key.ok());
  return *key;
}

class FakeChainClient final : public bridge::ChainClient {
 public:
  explicit FakeChainClient(std::string chain_id = "fake-chain-1")
      : chain_id_(std::move(chain_id)) {}

  // --- scripting --------------------------------------------------------------------------
  void SetChainId(std::string id) {
    absl::MutexLock l(&mu_);
    chain_id_ = std::move(id);
  }
  // Appends events at `height` and makes it at least the latest height.
  void AddEvent(int64_t height, tendermint::abci::Event event) {
    absl::MutexLock l(&mu_);
    events_[height].push_back(std::move(event));
    latest_ = std::max(latest_, height);
  }
  void SetLatestHeight(int64_t h) {
    absl::MutexLock l(&mu_);
    latest_ = h;
  }
  void SetAccount(std::string address, uint64_t number, uint64_t sequence) {
    absl::MutexLock l(&mu_);
    account_address_ = std::move(address);
    account_ = bridge::AccountInfo{number, sequence};
    mempool_sequence_ = sequence;
  }
  // A tx signed by someone else with this key took a sequence (as a CLI using the same key).
  void ConsumeSequence() {
    absl::MutexLock l(&mu_);
    if (account_) ++account_->sequence;
    mempool_sequence_ = std::max(mempool_sequence_ + 1, account_ ? account_->sequence : 0);
  }
  void SetWeight(std::string host, uint64_t weight) {
    absl::MutexLock l(&mu_);
    weights_.set_epoch(1);
    for (auto& w : *weights_.mutable_weights()) {
      if (w.host() == host) {
        w.set_weight(weight);
        return;
      }
    }
    auto* w = weights_.add_weights();
    w->set_host(std::move(host));
    w->set_weight(weight);
  }
  // Calls fail with UNAVAILABLE while set.
  // What Shard(id) answers; shards never set are NotFound.
  void SetShard(pb::Shard shard) {
    absl::MutexLock l(&mu_);
    uint64_t id = shard.id();
    shards_[id] = std::move(shard);
  }
  void SetUnavailable(bool v) {
    absl::MutexLock l(&mu_);
    unavailable_ = v;
  }
  void FailEventsAt(int64_t h) {
    absl::MutexLock l(&mu_);
    fail_events_.insert(h);
  }
  void ClearFailures() {
    absl::MutexLock l(&mu_);
    fail_events_.clear();
    fail_weights_ = false;
    fail_broadcast_ = false;
    unavailable_ = false;
  }
  void FailWeights(bool v) {
    absl::MutexLock l(&mu_);
    fail_weights_ = v;
  }
  void FailBroadcast(bool v) {
    absl::MutexLock l(&mu_);
    fail_broadcast_ = v;
  }
  // The next broadcasts answer these responses (after the sequence check passes).
  void ScriptBroadcast(uint32_t code, std::string codespace, std::string raw_log,
                       int64_t gas_used = 0) {
    absl::MutexLock l(&mu_);
    TxResponse r;
    r.set_code(code);
    r.set_codespace(std::move(codespace));
    r.set_raw_log(std::move(raw_log));
    r.set_gas_used(gas_used);
    scripted_.push_back(std::move(r));
  }
  // Puts every mempool tx into a block at `height`, in order; a delivered code may be scripted.
  void MakeBlock(int64_t height, uint32_t delivered_code = 0, std::string raw_log = "",
                 std::string codespace = "trainshard", int64_t gas_used = 0) {
    absl::MutexLock l(&mu_);
    for (auto& [hash, bytes] : mempool_) {
      TxResponse r;
      r.set_height(height);
      r.set_txhash(hash);
      r.set_code(delivered_code);
      r.set_codespace(delivered_code == 0 ? "" : codespace);
      r.set_raw_log(raw_log);
      r.set_gas_used(gas_used);
      included_[hash] = r;
      if (account_) ++account_->sequence;
    }
    mempool_.clear();
    latest_ = std::max(latest_, height);
  }
  // Forgets the mempool (a node restart).
  void DropMempool() {
    absl::MutexLock l(&mu_);
    mempool_.clear();
    mempool_sequence_ = account_ ? account_->sequence : 0;
  }

  // --- observations -----------------------------------------------------------------------
  std::vector<std::string> broadcasts() const {
    absl::MutexLock l(&mu_);
    return broadcasts_;
  }
  std::vector<std::string> mempool_hashes() const {
    absl::MutexLock l(&mu_);
    std::vector<std::string> out;
    for (const auto& [h, b] : mempool_) out.push_back(h);
    return out;
  }
  std::vector<pb::MsgSettleTrainshard> settles() const {
    absl::MutexLock l(&mu_);
    return settles_;
  }
  int events_calls() const {
    absl::MutexLock l(&mu_);
    return events_calls_;
  }

  // --- ChainClient ------------------------------------------------------------------------
  absl::StatusOr<bridge::ChainStatus> Status() override {
    absl::MutexLock l(&mu_);
    if (unavailable_) return Down();
    bridge::ChainStatus s;
    s.chain_id = chain_id_;
    s.latest_height = latest_;
    return s;
  }
  absl::StatusOr<std::vector<tendermint::abci::Event>> EventsAt(int64_t height) override {
    absl::MutexLock l(&mu_);
    ++events_calls_;
    if (unavailable_ || fail_events_.count(height) != 0) return Down();
    if (height > latest_) return absl::NotFoundError(absl::StrCat("height ", height));
    auto it = events_.find(height);
    if (it == events_.end()) return std::vector<tendermint::abci::Event>{};
    return it->second;
  }
  absl::StatusOr<bridge::AccountInfo> Account(const std::string& address) override {
    absl::MutexLock l(&mu_);
    if (unavailable_) return Down();
    if (!account_ || address != account_address_) {
      return absl::NotFoundError(absl::StrCat("account ", address));
    }
    return *account_;
  }
  absl::StatusOr<uint64_t> Balance(const std::string&) override { return 0; }
  absl::StatusOr<pb::Shard> Shard(uint64_t id) override {
    absl::MutexLock l(&mu_);
    if (unavailable_) return Down();
    auto it = shards_.find(id);
    if (it == shards_.end()) return absl::NotFoundError(absl::StrCat("shard ", id));
    return it->second;
  }
  absl::StatusOr<std::vector<pb::Shard>> Shards(pb::ShardStatus) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<pb::EpochWeights> Weights(uint64_t, bool) override {
    absl::MutexLock l(&mu_);
    if (unavailable_ || fail_weights_) return Down();
    return weights_;
  }
  absl::StatusOr<pb::Proposal> Proposal(uint64_t) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<pb::QueryEscrowResponse> Escrow(uint64_t) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<pb::SettlementRecord> Settlement(uint64_t) override {
    return absl::UnimplementedError("fake");
  }
  // Fees of 0.001 ngonka per unit of gas.
  absl::StatusOr<pb::QueryParamsResponse> Params() override {
    absl::MutexLock l(&mu_);
    if (unavailable_) return Down();
    pb::QueryParamsResponse r;
    r.mutable_params()->set_min_gas_price("0.001");
    return r;
  }

  // Every tx uses kSimulatedGas.
  static constexpr int64_t kSimulatedGas = 100000;
  absl::StatusOr<TxResponse> Simulate(const std::string&) override {
    absl::MutexLock l(&mu_);
    if (unavailable_) return Down();
    TxResponse r;
    r.set_gas_used(kSimulatedGas);
    return r;
  }

  absl::StatusOr<TxResponse> BroadcastRaw(const std::string& tx_bytes) override {
    absl::MutexLock l(&mu_);
    broadcasts_.push_back(tx_bytes);
    if (unavailable_ || fail_broadcast_) return Down();
    std::string hash = bridge::TxHash(tx_bytes);
    TxResponse r;
    r.set_txhash(hash);
    bool in_mempool = false;
    for (const auto& [h, b] : mempool_) in_mempool = in_mempool || h == hash;
    if (included_.count(hash) != 0 || in_mempool) {
      r.set_code(19);
      r.set_codespace("sdk");
      r.set_raw_log("tx already in mempool");
      return r;
    }
    auto decoded = bridge::DecodeTx(tx_bytes);
    if (!decoded.ok()) {
      r.set_code(3);
      r.set_codespace("trainshard");
      r.set_raw_log(std::string(decoded.status().message()));
      return r;
    }
    uint64_t seq = decoded->auth_info.signer_infos(0).sequence();
    if (seq != mempool_sequence_) {
      r.set_code(32);
      r.set_codespace("sdk");
      r.set_raw_log(absl::StrCat("account sequence mismatch, expected ", mempool_sequence_,
                                 ", got ", seq, ": incorrect account sequence"));
      return r;
    }
    if (!scripted_.empty()) {
      TxResponse s = scripted_.front();
      scripted_.pop_front();
      s.set_txhash(hash);
      if (s.code() != 0) return s;
    }
    ++mempool_sequence_;
    mempool_.emplace_back(hash, tx_bytes);
    return r;
  }
  absl::StatusOr<TxResponse> GetTx(const std::string& txhash) override {
    absl::MutexLock l(&mu_);
    if (unavailable_) return Down();
    auto it = included_.find(txhash);
    if (it == included_.end()) return absl::NotFoundError(absl::StrCat("tx ", txhash));
    return it->second;
  }
  absl::StatusOr<TxResponse> SignAndBroadcast(const common::PrivateKey&,
                                              const std::vector<google::protobuf::Any>& msgs,
                                              bool) override {
    absl::MutexLock l(&mu_);
    if (unavailable_) return Down();
    for (const auto& any : msgs) {
      pb::MsgSettleTrainshard m;
      if (any.UnpackTo(&m)) settles_.push_back(m);
    }
    TxResponse r;
    r.set_txhash("SETTLE");
    r.set_height(latest_);
    return r;
  }

 private:
  static absl::Status Down() { return absl::UnavailableError("fake chain is down"); }

  mutable absl::Mutex mu_;
  std::string chain_id_ ABSL_GUARDED_BY(mu_);
  int64_t latest_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::vector<tendermint::abci::Event>> events_ ABSL_GUARDED_BY(mu_);
  std::string account_address_ ABSL_GUARDED_BY(mu_);
  std::optional<bridge::AccountInfo> account_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, pb::Shard> shards_ ABSL_GUARDED_BY(mu_);
  uint64_t mempool_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  pb::EpochWeights weights_ ABSL_GUARDED_BY(mu_);
  bool unavailable_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_weights_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_broadcast_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int64_t> fail_events_ ABSL_GUARDED_BY(mu_);
  std::deque<TxResponse> scripted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> mempool_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, TxResponse> included_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> broadcasts_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::MsgSettleTrainshard> settles_ ABSL_GUARDED_BY(mu_);
  int events_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ts::sidecar::testing

#endif  // TS_SIDECAR_HOST_FAKE_CHAIN_CLIENT_H_
