// settlement_bench: how long the chain takes to verify and apply one settlement signed by
// 1,000 hosts (CheckTx + FinalizeBlock of the settle tx), against a 50 ms target.
//
// Setup (not timed): a genesis with 1,000 hosts' PoC weights, a governance proposal for a shard
// with max_nodes 1000, votes, 1,000 real signed reservations (the shard runs), and a settlement
// paying every host, signed by all 1,000. Timed: on a fresh App restored from that state, CheckTx
// then FinalizeBlock of the settle tx; repeated, median reported. Single-threaded (the App is).
//
// Flags: --reps=N (default 5) and --members=N (default 1000; 10..10,000). Under
// `valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*TimedCheckAndFinalize*'`
// the instruction counts cover exactly the timed part.
//
// Prints the figures and, last, one JSON line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "chain-bridge/module/app.h"
#include "chain-bridge/module/tx.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/signing.h"
#include "common/protocol.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "proto/deterministic.h"

namespace {

namespace pb = ::gonka::trainshard::v1;
using ts::bridge::App;
using ts::bridge::BuildSignedTx;
using ts::bridge::GovProposalMsg;
using ts::bridge::PackMsg;
using ts::common::PrivateKey;

constexpr char kChainId[] = "trainshard-bench-1";
// The genesis asks for no fee; each tx asks for this much gas (a 10,000-member settlement
// checks 10,000 signatures).
constexpr uint64_t kGasLimit = 100'000'000;
constexpr int kDefaultHosts = 1000;
constexpr int kDefaultRepetitions = 5;
constexpr double kTargetMs = 50.0;
constexpr uint64_t kEscrow = 1'000'000'000;
// Every host did the same work (100 rounds), so the escrow is paid out in equal shares by the
// reward policy (1,000,000 each to 1,000 hosts, within the per-host cap), the rounding refunded.
constexpr uint64_t kRoundsEach = 100;
constexpr int kMembersMax = 10'000;  // the module's cap on max_nodes_limit

// The per-host cap: 1% per host, or more when there are fewer than 100 hosts (the spec needs
// bps * nodes >= 10000).
uint32_t ShareBps(int hosts) {
  return static_cast<uint32_t>(std::max(100, (10000 + hosts - 1) / hosts));
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "settlement_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string Addr(const PrivateKey& key) {
  return ts::common::AddressFromPublicKey(key.public_key());
}

class Setup {
 public:
  explicit Setup(int hosts)
      : hosts_count_(hosts),
        creator_(PrivateKey::FromBytes(ts::common::Sha256("bench/creator")).value()) {
    for (int i = 0; i < hosts_count_; ++i) {
      hosts_.push_back(
          PrivateKey::FromBytes(ts::common::Sha256("bench/host/" + std::to_string(i))).value());
    }
    genesis_.set_chain_id(kChainId);
    auto* params = genesis_.mutable_params();
    params->set_epoch_length_blocks(1'000'000);
    params->set_voting_period_blocks(1);
    params->set_min_deposit("1");
    params->set_quorum_ppm(334000);
    params->set_threshold_ppm(500000);
    params->set_veto_threshold_ppm(334000);
    params->set_poc_authority(Addr(creator_));
    params->set_max_nodes_limit(static_cast<uint64_t>(hosts_count_));
    params->set_max_weights_per_submission(static_cast<uint64_t>(hosts_count_));
    params->set_max_duration_blocks_limit(100'000);
    auto* creator = genesis_.add_accounts();
    creator->set_address(Addr(creator_));
    creator->set_balance(std::to_string(10 * kEscrow));
    for (int i = 0; i < hosts_count_; ++i) {
      auto* account = genesis_.add_accounts();
      account->set_address(Addr(hosts_[static_cast<size_t>(i)]));
      account->set_balance("1");
      auto* weight = genesis_.add_poc_weights();
      weight->set_host(Addr(hosts_[static_cast<size_t>(i)]));
      weight->set_weight(1000 + static_cast<uint64_t>(i));
    }
  }

  void Run() {
    auto app = App::InitChain(genesis_);
    if (!app.ok()) Die(std::string(app.status().message()));
    app_ = *std::move(app);

    pb::ShardSpec spec;
    spec.set_run_spec_hash(ts::common::Sha256("bench run spec"));
    spec.set_hardware_profile("h100-80g");
    spec.set_min_nodes(1);
    spec.set_max_nodes(static_cast<uint64_t>(hosts_count_));
    spec.set_max_duration_blocks(1000);
    spec.set_reservation_window_blocks(100);
    spec.mutable_escrow()->set_denom("ngonka");
    spec.mutable_escrow()->set_amount(std::to_string(kEscrow));
    spec.mutable_artifact_quota()->set_bytes_max(1ull << 40);
    spec.mutable_artifact_quota()->set_files_max(100000);
    spec.mutable_reward_policy()->set_kind(pb::RewardPolicy::KIND_VERIFIED_WORK);
    spec.mutable_reward_policy()->set_max_host_share_bps(ShareBps(hosts_count_));
    pb::MsgCreateTrainshardProposal create;
    create.set_authority(app_->GovAddress());
    create.set_creator(Addr(creator_));
    *create.mutable_spec() = spec;
    Block({Sign(creator_,
                {GovProposalMsg(Addr(creator_), "bench shard", "", "1", {PackMsg(create)})})});
    const uint64_t shard_id = 1;

    // Votes by 70% of the hosts: quorum and majority. The proposal passes at the end of the next
    // block.
    std::vector<std::string> votes;
    for (int i = 0; i < hosts_count_ * 7 / 10; ++i) {
      cosmos::gov::v1::MsgVote vote;
      vote.set_proposal_id(1);
      vote.set_voter(Addr(hosts_[static_cast<size_t>(i)]));
      vote.set_option(cosmos::gov::v1::VOTE_OPTION_YES);
      votes.push_back(Sign(hosts_[static_cast<size_t>(i)], {PackMsg(vote)}));
    }
    Block(votes);
    if (app_->GetShard(shard_id)->status() != pb::SHARD_STATUS_OPEN) Die("shard did not open");

    std::vector<std::string> reservations;
    for (const auto& host : hosts_) {
      pb::Reservation r;
      r.set_shard_id(shard_id);
      r.set_host(Addr(host));
      r.set_endpoint("10.1.2.3:7100");
      r.set_tls_cert_sha256(ts::common::Sha256(Addr(host)));
      r.set_valid_until_height(app_->height() + 50);
      r.set_signature(ts::common::SignStatement(host, "reservation", kChainId, shard_id,
                                                ts::DeterministicBytes(r))
                          .value());
      pb::MsgReserveTrainshard msg;
      *msg.mutable_reservation() = r;
      reservations.push_back(Sign(host, {PackMsg(msg)}));
    }
    Block(reservations);
    auto shard = app_->GetShard(shard_id);
    if (shard->status() != pb::SHARD_STATUS_RUNNING || shard->reservations_size() != hosts_count_) {
      Die("shard is not running with all hosts as members");
    }

    pb::Settlement s;
    s.set_chain_id(kChainId);
    s.set_shard_id(shard_id);
    s.set_final_checkpoint_root(ts::common::Sha256("final checkpoint"));
    s.mutable_evaluation()->set_metric("eval_loss");
    s.mutable_evaluation()->set_value_micro(1'234'567);
    s.mutable_evaluation()->set_evaluators(static_cast<uint32_t>(hosts_count_));
    const uint64_t n = static_cast<uint64_t>(hosts_count_);
    const uint64_t share =
        ts::protocol::PayoutOf(kEscrow, false, ShareBps(hosts_count_),
                               {.units = kRoundsEach, .forfeit = false}, kRoundsEach * n, n);
    for (const auto& host : hosts_) {
      auto* payout = s.add_payouts();
      payout->set_host(Addr(host));
      payout->set_amount(std::to_string(share));
      payout->set_rounds_contributed(kRoundsEach);
    }
    s.set_refund(std::to_string(kEscrow - share * static_cast<uint64_t>(hosts_count_)));
    s.set_rounds_completed(100);
    s.set_rounds_planned(100);
    pb::MsgSettleTrainshard settle;
    settle.set_submitter(Addr(creator_));
    *settle.mutable_settlement() = s;
    const std::string canonical = ts::DeterministicBytes(s);
    for (const auto& host : hosts_) {
      auto* sig = settle.add_signatures();
      sig->set_host(Addr(host));
      sig->set_signature(
          ts::common::SignStatement(host, "settlement", kChainId, shard_id, canonical).value());
    }
    settle_tx_ = Sign(creator_, {PackMsg(settle)});
    digest_ = ts::common::Sha256(
        ts::common::SignBytes("settlement", kChainId, shard_id, canonical).value());
    for (const auto& sig : settle.signatures()) signatures_.push_back(sig.signature());
  }

  const pb::Genesis& genesis() const { return genesis_; }
  const App& app() const { return *app_; }
  const std::string& settle_tx() const { return settle_tx_; }
  // The settlement's signature digest and the 1,000 signatures (the peer measurement).
  const std::string& digest() const { return digest_; }
  const std::vector<std::string>& signatures() const { return signatures_; }

 private:
  std::string Sign(const PrivateKey& key, const std::vector<google::protobuf::Any>& msgs) {
    auto account = app_->Account(Addr(key));
    if (!account.ok()) Die(std::string(account.status().message()));
    return BuildSignedTx(key, kChainId, account->first, account->second, msgs,
                         ts::bridge::TxFee{kGasLimit, 0});
  }

  void Block(const std::vector<std::string>& txs) {
    tendermint::types::Header header;
    header.set_chain_id(kChainId);
    header.set_height(app_->height() + 1);
    auto outcome = app_->FinalizeBlock(header, txs);
    if (!outcome.ok()) Die(std::string(outcome.status().message()));
    for (const auto& result : outcome->results.tx_results()) {
      if (result.code() != 0) Die("setup tx refused: " + result.raw_log());
    }
    app_->Commit();
  }

  int hosts_count_;
  PrivateKey creator_;
  std::vector<PrivateKey> hosts_;
  pb::Genesis genesis_;
  std::unique_ptr<App> app_;
  std::string settle_tx_;
  std::string digest_;
  std::vector<std::string> signatures_;
};

// CPU time of this thread: on a loaded shared machine it shows the work apart from waiting.
double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// The timed part, out of line so that callgrind can collect exactly it (--toggle-collect).
[[gnu::noinline]] void TimedCheckAndFinalize(App& app, const std::string& tx,
                                             const tendermint::types::Header& header,
                                             cosmos::base::abci::v1beta1::TxResponse* checked,
                                             absl::StatusOr<ts::bridge::BlockOutcome>* outcome,
                                             double* check_ms, double* check_cpu_ms) {
  auto start = std::chrono::steady_clock::now();
  double cpu_start = ThreadCpuMs();
  *checked = app.CheckTx(tx);
  *check_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  *check_cpu_ms = ThreadCpuMs() - cpu_start;
  if (checked->code() != 0) return;
  *outcome = app.FinalizeBlock(header, {tx});
}

// --name=N for a positive int N; Die()s on anything else.
int ParseIntFlag(std::string_view arg, std::string_view name, int min) {
  std::string_view value = arg.substr(name.size() + 3);
  int parsed = 0;
  for (char c : value) {
    if (c < '0' || c > '9' || parsed > 1'000'000)
      Die(std::string(arg) + ": not an integer up to 1000000");
    parsed = parsed * 10 + (c - '0');
  }
  if (value.empty() || parsed < min) {
    Die(std::string(arg) + ": want an integer >= " + std::to_string(min));
  }
  return parsed;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int hosts = kDefaultHosts;
  int repetitions = kDefaultRepetitions;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.rfind("--reps=", 0) == 0) {
      repetitions = ParseIntFlag(arg, "reps", 1);
    } else if (arg.rfind("--members=", 0) == 0) {
      hosts = ParseIntFlag(arg, "members", 10);
      if (hosts > kMembersMax) Die(std::string(arg) + ": at most " + std::to_string(kMembersMax));
    } else {
      Die(std::string(arg) + ": unknown flag (--reps=N, --members=N)");
    }
  }
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  std::printf("settlement_bench: setting up %d hosts, reservations and signatures...\n", hosts);
  auto setup_start = Clock::now();
  Setup setup(hosts);
  setup.Run();
  std::printf("setup: %.0f ms; settle tx %zu bytes\n", ms_since(setup_start),
              setup.settle_tx().size());

  const App& base = setup.app();
  tendermint::types::Header header;
  header.set_chain_id(kChainId);
  header.set_height(base.height() + 1);
  std::vector<double> total_ms, total_cpu_ms, check_cpu_ms, recover_cpu_ms, check_ms, finalize_ms,
      cold_ms, recover_ms;
  std::string expected_hash;
  for (int rep = 0; rep < repetitions; ++rep) {
    auto app = App::Restore(setup.genesis(), base.state(), base.height(), base.app_hash());
    if (!app.ok()) Die(std::string(app.status().message()));
    cosmos::base::abci::v1beta1::TxResponse checked;
    absl::StatusOr<ts::bridge::BlockOutcome> outcome = absl::UnknownError("not run");
    double check = 0;
    double check_cpu = 0;
    auto start = Clock::now();
    double cpu_start = ThreadCpuMs();
    TimedCheckAndFinalize(**app, setup.settle_tx(), header, &checked, &outcome, &check, &check_cpu);
    double total = ms_since(start);
    double total_cpu = ThreadCpuMs() - cpu_start;
    if (checked.code() != 0) Die("CheckTx refused the settlement: " + checked.raw_log());
    double finalize = total - check;
    if (!outcome.ok() || outcome->results.tx_results(0).code() != 0) {
      Die("FinalizeBlock refused the settlement");
    }
    if ((*app)->GetShard(1)->status() != pb::SHARD_STATUS_SETTLED) Die("shard not settled");
    if (expected_hash.empty()) expected_hash = (*app)->app_hash();
    if ((*app)->app_hash() != expected_hash) Die("app hash differs between repetitions");
    check_ms.push_back(check);
    finalize_ms.push_back(finalize);
    total_ms.push_back(total);
    total_cpu_ms.push_back(total_cpu);
    check_cpu_ms.push_back(check_cpu);

    // The same block on a node that never saw the tx in CheckTx (no remembered recoveries).
    auto cold = App::Restore(setup.genesis(), base.state(), base.height(), base.app_hash());
    auto cold_start = Clock::now();
    auto cold_outcome = (*cold)->FinalizeBlock(header, {setup.settle_tx()});
    cold_ms.push_back(ms_since(cold_start));
    if (!cold_outcome.ok() || (*cold)->app_hash() != expected_hash) Die("cold replay differs");

    // Peer in the same run: the bare public-key recoveries the settlement needs.
    auto recover_start = Clock::now();
    double recover_cpu_start = ThreadCpuMs();
    for (const auto& sig : setup.signatures()) {
      if (!ts::common::RecoverPublicKey(setup.digest(), sig).ok()) Die("recover failed");
    }
    recover_ms.push_back(ms_since(recover_start));
    recover_cpu_ms.push_back(ThreadCpuMs() - recover_cpu_start);
    std::printf(
        "rep %d: CheckTx %.2f ms + FinalizeBlock %.2f ms = %.2f ms (cpu %.2f ms); cold "
        "FinalizeBlock %.2f ms; %d bare recoveries %.2f ms (cpu %.2f ms, CheckTx cpu %.2f ms)\n",
        rep + 1, check, finalize, total, total_cpu, cold_ms.back(), hosts, recover_ms.back(),
        recover_cpu_ms.back(), check_cpu);
  }
  double median = Median(total_ms);
  double per_signature = median / hosts;
  double ratio = median / kTargetMs;
  // The target is for one core: the thread's CPU time, which on a loaded machine leaves out the
  // time other processes held the core (on a quiet one it equals the wall time).
  double cpu_ratio = Median(total_cpu_ms) / kTargetMs;
  double recover = Median(recover_ms);
  std::printf(
      "median CheckTx + FinalizeBlock: %.2f ms wall, %.2f ms cpu (CheckTx %.2f, "
      "FinalizeBlock %.2f)\n",
      median, Median(total_cpu_ms), Median(check_ms), Median(finalize_ms));
  std::printf(
      "per signature: %.4f ms; target %.0f ms on one core; ratio to target %.3f in cpu time (%s), "
      "%.3f in wall time\n",
      per_signature, kTargetMs, cpu_ratio, cpu_ratio <= 1.0 ? "within target" : "over target",
      ratio);
  std::printf("median cold FinalizeBlock (no prior CheckTx): %.2f ms\n", Median(cold_ms));
  double recover_cpu = Median(recover_cpu_ms);
  std::printf(
      "peer: %d bare secp256k1 recoveries %.2f ms wall, %.2f ms cpu; CheckTx + FinalizeBlock = "
      "%.2fx that in cpu time\n",
      hosts, recover, recover_cpu, Median(total_cpu_ms) / recover_cpu);
  std::printf(
      "{\"bench\":\"settlement_verify_apply\",\"signatures\":%d,\"median_ms\":%.3f,"
      "\"median_cpu_ms\":%.3f,\"check_tx_ms\":%.3f,\"finalize_block_ms\":%.3f,"
      "\"cold_finalize_block_ms\":%.3f,\"bare_recover_ms\":%.3f,"
      "\"bare_recover_cpu_ms\":%.3f,\"ms_per_signature\":%.5f,\"target_ms\":%.0f,"
      "\"ratio\":%.4f,\"cpu_ratio\":%.4f}\n",
      hosts, median, Median(total_cpu_ms), Median(check_ms), Median(finalize_ms), Median(cold_ms),
      recover, recover_cpu, per_signature, kTargetMs, ratio, cpu_ratio);
  return 0;
}
