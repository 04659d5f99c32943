#include "tests/sim/round_sim.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/protocol.h"
#include "proto/deterministic.h"
#include "sidecar/collective/aggregate.h"
#include "sidecar/collective/codec.h"
#include "sidecar/peer/shard_directory.h"
#include "sidecar/shard/ledger.h"
#include "sidecar/shard/run_context.h"
#include "sidecar/shard/shard_db.h"
#include "sidecar/shard/verdicts.h"
#include "state/db.h"
#include "tests/sim/sim_world.h"

namespace ts::sim {
namespace {

constexpr uint64_t kShard = 7;
constexpr char kChainId[] = "sim-chain";
constexpr uint64_t kEscrow = 1000000;
constexpr int kCheckStatusEvery = 16;

// Every fourth seed (1, 5, 9, ...) runs with commitments and replays at half the rounds
// (docs/verification.md), so the commit-before-reveal exchange and the validators meet the same
// faults as the ring.
std::string SpecOf(uint32_t rounds, uint32_t replay_rate_bps, const std::string& scoring) {
  return absl::StrCat(
      R"({
  "version": 1,
  "model": {"kind": "gpt", "seed": "7",
            "config": {"layers": 2, "dModel": 64, "heads": 4, "context": 32, "vocab": 512,
                       "mlpRatio": 4}},
  "data": {"corpus": "fortunes", "files": 4, "vocab": 512, "shardTokens": 8192, "evalEvery": 20},
  "rounds": )",
      rounds, R"(, "innerSteps": 10, "batchSize": 8,
  "inner": {"lr": 0.003, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weightDecay": 0.1,
            "gradClipNorm": 1.0},
  "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true},
  "codec": "int8", "aggregation": "mean", "evalEvery": 2, "evalBatchSize": 16, "seed": "5",
  "joinWindowMs": 2000, "plannerTimeoutMs": 3000, "exchangeTimeoutMs": 10000)",
      replay_rate_bps > 0
          ? absl::StrCat(R"(, "verification": {"commitments": true, "replayRateBps": )",
                         replay_rate_bps, R"(, "scoring": ")", scoring, "\"}")
          : "",
      "}");
}

enum class Fault { kKill, kWorker, kPartition, kSlow, kStall, kLie };
constexpr const char* kFaultNames[] = {"kill", "worker", "partition", "slow", "stall", "lie"};

struct PlannedFault {
  int64_t at = 0;
  Fault kind = Fault::kKill;
  size_t host = 0;
  int64_t duration = 0;
};

struct Host {
  common::PrivateKey key = common::PrivateKey::Generate();
  std::string address;
  uint64_t weight = 0;
  std::string dir;
  std::unique_ptr<state::Db> db;
  std::unique_ptr<sidecar::ShardArtifacts> artifacts;
  sidecar::ShardRunHost run_host;
  std::unique_ptr<sidecar::ShardRun> run;
  std::shared_ptr<sidecar::RunWorker> worker;
  int thread = 0;
  bool stopping = false;
  int64_t restart_at = -1;
  uint64_t checked_round = 0;
  std::string checked_root;  // of checked_round
  bool resume_pending = false;
  uint64_t resume_round = 0;
  int64_t lie_until = 0;
};

uint64_t Mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ULL;
  return h;
}

class RoundSim {
 public:
  explicit RoundSim(const SimOptions& options)
      : options_(options),
        rng_(options.seed * 0x9e3779b97f4a7c15ULL + 1),
        scheduler_(options.seed ^ 0x5ca1ab1eULL),
        clock_(&scheduler_),
        net_(&scheduler_, options.seed ^ 0xfeedULL) {}
  ~RoundSim() {
    std::error_code ec;
    if (!root_dir_.empty()) std::filesystem::remove_all(root_dir_, ec);
  }

  SimResult Run();

 private:
  absl::Status Setup();
  void StartHost(Host& h);
  void Kill(Host& h, int64_t restart_after);
  void PlanFaults();
  void ApplyFaults(int64_t now);
  void EndFaults(int64_t now);
  void Reap(int64_t now);
  bool CheckRecords(Host& h);
  bool CheckContributions(const pb::RoundCertificate& c);
  bool CheckResume(Host& h);
  bool Finished();
  bool CheckEnd();
  // The verdicts of a settled host's certificates: no honest host is marked.
  bool CheckMarks();
  // The attacker's index, or -1, and whether its attack is on its own work (its Δ or its
  // evaluations: every kind but the lying validator).
  int Attacker() const { return attacker_; }
  bool OwnWorkAttack() const {
    return attacker_ >= 0 && attack_ != Attack::kNone && attack_ != Attack::kLyingValidator;
  }
  // Whether the attacker's tampered Δ or evaluation is in a round one of `certs` certifies.
  bool Attacked(const std::vector<pb::RoundCertificate>& certs);
  // Whether an attacker on its Δ must go unpaid for its tampered rounds whichever they are:
  // every round replayed and no fault to delay a verdict. Those before the last two are
  // confirmed and forfeit its pay; the last two pay nobody (verdicts.h PaidRounds).
  bool UnpaidWhenAttacking() const {
    return OwnWorkAttack() && attack_ != Attack::kLyingEvaluator && !options_.faults &&
           spec_.spec.verification().replay_rate_bps() == 10000;
  }
  // Whether the attacker contributed a round it did not tamper with among those the settlement
  // pays for (it may be paid for that one).
  bool HonestPaidRound(const std::vector<pb::RoundCertificate>& certs);
  void Teardown();
  // Each host's state, certified round and last status lines.
  std::string DescribeHosts();
  bool Violation(const std::string& what);
  void Note(const std::string& what);

  // The chain's side of the shard.
  absl::StatusOr<pb::Shard> ChainShard(uint64_t id) const;
  int64_t ChainHeight() const { return 1 + scheduler_.now() / kSimBlockMs; }
  // Past the deadline without a settlement.
  bool Expired() const {
    return !settled_ && options_.deadline_ms > 0 &&
           ChainHeight() >= options_.deadline_ms / kSimBlockMs;
  }
  absl::StatusOr<pb::SettlementSignature> SignSettlement(Host& h, const pb::Settlement& draft);
  absl::StatusOr<std::string> Submit(const pb::Settlement& s,
                                     const std::vector<pb::SettlementSignature>& sigs);

  const SimOptions options_;
  Rng rng_;
  SimScheduler scheduler_;
  SimClock clock_;
  SimNet net_;
  std::string root_dir_;
  std::vector<std::unique_ptr<Host>> hosts_;
  sidecar::StaticShardDirectory directory_;
  sidecar::ShardView view_;
  uint64_t total_weight_ = 0;
  uint32_t rounds_ = 0;
  int attacker_ = -1;
  Attack attack_ = Attack::kNone;
  sidecar::ParsedRunSpec spec_;
  sidecar::ShardRunOptions run_options_;
  std::vector<PlannedFault> faults_;
  size_t next_fault_ = 0;
  std::map<std::string, int> fault_counts_;
  bool faults_over_ = false;
  int64_t partitions_until_ = 0;
  std::map<uint64_t, std::string> roots_;  // round -> its final root (the next round's base)
  std::map<std::string, std::string> attempt_roots_;  // "round/attempt" -> root
  bool settled_ = false;
  std::string settled_root_;
  SimResult result_;
  uint64_t trace_ = 0xcbf29ce484222325ULL;
};

// With commitments, a certificate names every member's commitment and the data it was to
// train on; without, none.
bool RoundSim::CheckContributions(const pb::RoundCertificate& c) {
  const pb::RoundResult& r = c.result();
  const int want = spec_.commitments ? r.members_size() : 0;
  if (r.contributions_size() != want) {
    return Violation(absl::StrCat("round ", r.round(), " has ", r.contributions_size(),
                                  " contributions for ", want, " committing members"));
  }
  if (absl::Status s = sidecar::CheckContributions(r); !s.ok()) return Violation(s.ToString());
  const std::string seed = sidecar::DataSeedOf(spec_.spec.seed(), r.round(), r.base_root());
  for (int i = 0; i < r.contributions_size(); ++i) {
    const pb::Contribution& k = r.contributions(i);
    if (k.assignment() != sidecar::AssignmentIdOf(spec_.hash, seed, r.round(), k.host())) {
      return Violation(absl::StrCat("round ", r.round(), ": the assignment of ", k.host(),
                                    " is not the one its plan drew"));
    }
    // The commitment binds the Δ that member's worker computed, as the codec encodes it.
    const auto& deltas = net_.Host(k.host())->deltas;
    auto delta = deltas.find(r.base_root() + seed);
    absl::StatusOr<std::string> commitment = absl::NotFoundError("no Δ");
    if (delta != deltas.end()) {
      std::vector<float> values(delta->second.size() / sizeof(float));
      std::memcpy(values.data(), delta->second.data(), delta->second.size());
      commitment = sidecar::DeltaCommitmentOf(spec_, static_cast<size_t>(i), values);
    }
    if (!commitment.ok() || k.delta_commitment() != *commitment) {
      return Violation(absl::StrCat("round ", r.round(), ": the commitment of ", k.host(),
                                    " does not bind the Δ its worker computed"));
    }
  }
  return true;
}

bool RoundSim::Violation(const std::string& what) {
  result_.ok = false;
  result_.violation = absl::StrCat("seed ", options_.seed, " at t=", scheduler_.now(),
                                   " ms (event ", scheduler_.events(), "): ", what);
  if (options_.verbose && what.find("\n  ") == std::string::npos) {
    absl::StrAppend(&result_.violation, DescribeHosts());
  }
  return false;
}

void RoundSim::Note(const std::string& what) {
  trace_ = Mix(trace_, std::hash<std::string>{}(what));
  if (options_.verbose)
    std::fprintf(stderr, "sim t=%lld %s\n", (long long)scheduler_.now(), what.c_str());
}

absl::Status RoundSim::Setup() {
  char dir_template[] = "/tmp/ts-sim-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp");
  root_dir_ = dir_template;
  size_t n = 3 + rng_.Below(3);
  bool equal = rng_.Chance(0.5);
  if (options_.hosts > 0) {
    n = options_.hosts;
    equal = true;
  }
  rounds_ = 3 + static_cast<uint32_t>(rng_.Below(3));
  if (options_.rounds > 0) rounds_ = options_.rounds;
  uint32_t rate =
      options_.replay_rate_bps > 0 ? options_.replay_rate_bps : (options_.seed % 4 == 1 ? 5000 : 0);
  attacker_ = options_.attacker;
  attack_ = options_.attack;
  if (attacker_ < 0 && options_.hosts == 0 && options_.seed % 4 == 3) {
    // An attack seed: 4 or 5 equal hosts (one of three would hold a third of the weight, and
    // the others could not certify without it), every round replayed.
    n = 4 + rng_.Below(2);
    equal = true;
    attacker_ = static_cast<int>(rng_.Below(n));
    attack_ = static_cast<Attack>(1 + rng_.Below(kAttackKinds - 1));
    if (options_.replay_rate_bps == 0) rate = 10000;
  }
  result_.attack = attack_;
  TS_ASSIGN_OR_RETURN(spec_, sidecar::ParseRunSpec(SpecOf(rounds_, rate, options_.scoring)));
  view_.shard_id = kShard;
  view_.status = pb::SHARD_STATUS_RUNNING;
  for (size_t i = 0; i < n; ++i) {
    auto h = std::make_unique<Host>();
    TS_ASSIGN_OR_RETURN(h->key, common::PrivateKey::FromBytes(common::Sha256(
                                    absl::StrCat("sim-key/", options_.seed, "/", i))));
    h->address = common::AddressFromPublicKey(h->key.public_key());
    h->weight = equal ? 10 : 1 + rng_.Below(10);
    h->dir = absl::StrCat(root_dir_, "/", i);
    std::error_code ec;
    std::filesystem::create_directories(h->dir, ec);
    TS_ASSIGN_OR_RETURN(h->db, state::Db::Open(h->dir + "/state", sidecar::ShardDbOptions()));
    total_weight_ += h->weight;
    view_.members.push_back({h->address, SimNet::RoundEndpoint(h->address), h->weight});
    SimHostState& state = net_.hosts()[h->address];
    state.address = h->address;
    state.weight = h->weight;
    state.key = &h->key;
    if (attacker_ == static_cast<int>(i)) state.attack = attack_;
    h->artifacts = MakeSimArtifacts(&net_, h->address);
    hosts_.push_back(std::move(h));
  }
  directory_.Set(view_);
  run_options_.worker_binary = "sim";
  for (auto& hp : hosts_) {
    Host& h = *hp;
    sidecar::ShardRunHost& r = h.run_host;
    r.key = &h.key;
    r.address = h.address;
    r.chain_id = kChainId;
    r.directory = &directory_;
    r.artifacts = h.artifacts.get();
    r.db = h.db.get();
    r.clock = &clock_;
    r.chain_shard = [this](uint64_t id) { return ChainShard(id); };
    r.chain_height = [this]() -> absl::StatusOr<int64_t> { return ChainHeight(); };
    r.sign_settlement = [this, &h](const pb::Settlement& d) { return SignSettlement(h, d); };
    r.submit_settlement = [this](const pb::Settlement& s,
                                 const std::vector<pb::SettlementSignature>& sigs) {
      return Submit(s, sigs);
    };
    r.start_worker = [this, &h](const worker::WorkerProcessOptions& wo)
        -> absl::StatusOr<std::shared_ptr<sidecar::RunWorker>> {
      h.worker = MakeSimWorker(&net_, h.address, wo.work_dir);
      return h.worker;
    };
    r.start_transport = [this, &h]() -> absl::StatusOr<sidecar::StartedTransport> {
      return MakeSimTransport(&net_, h.address);
    };
    r.make_peers = [this, &h] { return MakeSimPeers(&net_, h.address); };
  }
  result_.hosts = n;
  result_.rounds = rounds_;
  Note(absl::StrCat(
      n, " hosts, weights ", equal ? "equal" : "drawn", ", ", rounds_, " rounds",
      attacker_ >= 0 ? absl::StrCat(", host ", attacker_, " attacks: ", AttackName(attack_)) : ""));
  return absl::OkStatus();
}

void RoundSim::StartHost(Host& h) {
  sidecar::ShardRunOptions options = run_options_;
  options.work_root = h.dir + "/shards";
  h.thread = scheduler_.StartThread(
      [&] { h.run = sidecar::ShardRun::Start(h.run_host, options, kShard, spec_); });
  net_.Host(h.address)->run = h.run.get();
  h.restart_at = -1;
}

void RoundSim::Kill(Host& h, int64_t restart_after) {
  if (h.run == nullptr || h.stopping) return;
  h.run->RequestStop();
  net_.Host(h.address)->run = nullptr;
  net_.FailMeshesOf(h.address, "sim: process killed");
  h.stopping = true;
  h.restart_at = restart_after < 0 ? -1 : scheduler_.now() + restart_after;
}

// A killed run whose thread has ended is let go; a host due back is started from its records.
void RoundSim::Reap(int64_t now) {
  for (auto& hp : hosts_) {
    Host& h = *hp;
    if (h.stopping && !scheduler_.Has(h.thread)) {
      h.run->Stop();
      h.run.reset();
      h.worker.reset();
      h.stopping = false;
    }
    if (h.run == nullptr && !h.stopping && h.restart_at >= 0 && now >= h.restart_at) {
      auto records = sidecar::LoadStoredCertificates(*h.db, kShard, 1, 1'000'000);
      h.resume_round = records.ok() ? records->size() : 0;
      h.resume_pending = true;
      Note(absl::StrCat("restart ", h.address.substr(0, 12), " from round ", h.resume_round));
      StartHost(h);
    }
  }
}

void RoundSim::PlanFaults() {
  if (!options_.faults) return;
  const size_t count = 4 + rng_.Below(10);
  for (size_t i = 0; i < count; ++i) {
    PlannedFault f;
    f.at = rng_.Between(0, options_.faults_until_ms - 1);
    f.kind = static_cast<Fault>(rng_.Below(6));
    f.host = rng_.Below(hosts_.size());
    f.duration = rng_.Between(200, 10'000);
    faults_.push_back(f);
  }
  std::stable_sort(faults_.begin(), faults_.end(),
                   [](const PlannedFault& a, const PlannedFault& b) { return a.at < b.at; });
  net_.set_faulty(true);
}

void RoundSim::ApplyFaults(int64_t now) {
  if (now >= partitions_until_) net_.Heal();
  for (auto& hp : hosts_) {
    SimHostState& s = *net_.Host(hp->address);
    if (s.lies && now >= hp->lie_until) s.lies = false;
  }
  while (next_fault_ < faults_.size() && faults_[next_fault_].at <= now) {
    const PlannedFault& f = faults_[next_fault_++];
    Host& h = *hosts_[f.host];
    SimHostState& s = *net_.Host(h.address);
    ++fault_counts_[kFaultNames[static_cast<int>(f.kind)]];
    Note(absl::StrCat("fault ", kFaultNames[static_cast<int>(f.kind)], " ", h.address.substr(0, 12),
                      " for ", f.duration, " ms"));
    switch (f.kind) {
      case Fault::kKill:
        Kill(h, f.duration);
        break;
      case Fault::kWorker:
        if (h.worker != nullptr) KillSimWorker(h.worker.get());
        break;
      case Fault::kPartition:
        for (auto& other : hosts_) {
          if (other.get() != &h) net_.Partition(h.address, other->address);
        }
        partitions_until_ = std::max(partitions_until_, now + f.duration);
        break;
      case Fault::kSlow:
        net_.set_slow_until(now + f.duration);
        break;
      case Fault::kStall:
        s.stall_until_ms = now + f.duration;
        break;
      case Fault::kLie:
        s.lies = true;
        h.lie_until = now + f.duration;
        break;
    }
  }
  if (!faults_over_ && options_.faults && now >= options_.faults_until_ms) EndFaults(now);
}

void RoundSim::EndFaults(int64_t now) {
  faults_over_ = true;
  net_.Heal();
  partitions_until_ = 0;
  net_.set_faulty(false);
  net_.set_slow_until(0);
  for (auto& hp : hosts_) {
    SimHostState& s = *net_.Host(hp->address);
    s.lies = false;
    s.stall_until_ms = 0;
    if (hp->restart_at > now) hp->restart_at = now;
  }
  Note("faults end");
}

bool RoundSim::CheckRecords(Host& h) {
  if (h.checked_round > 0) {
    // A record replaced (superseded by a later attempt's): checked again from the start.
    auto last = sidecar::LoadStoredCertificates(*h.db, kShard, h.checked_round, 1);
    if (!last.ok() || last->empty() || last->front().result().new_root() != h.checked_root) {
      Note(absl::StrCat("records of ", h.address.substr(0, 12), " replaced from round ",
                        h.checked_round, " down"));
      h.checked_round = 0;
      h.checked_root.clear();
      ++result_.superseded;
    }
  }
  auto certs = sidecar::LoadStoredCertificates(*h.db, kShard, h.checked_round + 1, 64);
  if (!certs.ok()) return Violation(absl::StrCat("records unreadable: ", certs.status().message()));
  for (const pb::RoundCertificate& c : *certs) {
    const uint64_t round = c.result().round();
    const std::string& root = c.result().new_root();
    if (round != h.checked_round + 1) {
      return Violation(
          absl::StrCat(h.address, " recorded round ", round, " after ", h.checked_round));
    }
    const std::string expected_base = round == 1 ? roots_[0] : h.checked_root;
    if (round == 1 && roots_[0].empty()) roots_[0] = c.result().base_root();
    if (round == 1 && c.result().base_root() != roots_[0]) {
      return Violation(absl::StrCat("round 1 of ", h.address, " is not on the round-0 root"));
    }
    if (!expected_base.empty() && c.result().base_root() != expected_base) {
      return Violation(
          absl::StrCat("round ", round, " of ", h.address, " does not continue the round before"));
    }
    // Certificates of one round may differ only across attempts (a later one supersedes);
    // a round's certificate is final once the next round's builds on it, and two final
    // certificates of a round never differ.
    const std::string key = absl::StrCat(round, "/", c.attempt());
    auto [known, fresh] = attempt_roots_.emplace(key, root);
    if (!fresh && known->second != root) {
      return Violation(absl::StrCat("two certificates of round ", round, " attempt ", c.attempt(),
                                    ": roots ", common::HexEncode(known->second).substr(0, 16),
                                    " and ", common::HexEncode(root).substr(0, 16), " (", h.address,
                                    ")"));
    }
    if (round > 1) {
      auto [final_root, first_seen] = roots_.emplace(round - 1, c.result().base_root());
      if (!first_seen && final_root->second != c.result().base_root()) {
        return Violation(absl::StrCat("two final certificates of round ", round - 1, ": roots ",
                                      common::HexEncode(final_root->second).substr(0, 16), " and ",
                                      common::HexEncode(c.result().base_root()).substr(0, 16), " (",
                                      h.address, ")"));
      }
    }
    uint64_t weight = 0;
    std::vector<std::string> signers;
    for (const auto& sig : c.signatures()) {
      const sidecar::ShardMember* m = view_.Find(sig.host());
      if (m == nullptr || std::find(signers.begin(), signers.end(), sig.host()) != signers.end()) {
        continue;
      }
      signers.push_back(sig.host());
      weight += m->weight;
    }
    if (3 * static_cast<unsigned __int128>(weight) <=
        2 * static_cast<unsigned __int128>(total_weight_)) {
      return Violation(absl::StrCat("round ", round, " certified by weight ", weight, " of ",
                                    total_weight_, ": not more than 2/3"));
    }
    if (!CheckContributions(c)) return false;
    h.checked_round = round;
    h.checked_root = root;
    trace_ = Mix(trace_, round);
  }
  return true;
}

bool RoundSim::CheckResume(Host& h) {
  if (!h.resume_pending || h.run == nullptr || h.stopping) return true;
  const pb::ShardRunStatus st = h.run->Status();
  if (st.state() == "starting" || st.state() == "preparing") return true;
  h.resume_pending = false;
  if (st.state() != "failed" && st.certified_round() < h.resume_round) {
    return Violation(absl::StrCat(h.address, " restarted at round ", st.certified_round(),
                                  " but its records hold ", h.resume_round));
  }
  return true;
}

bool RoundSim::Finished() {
  if (Expired()) return Violation("the shard reached its deadline without a settlement");
  if (!settled_ || !faults_over_) return false;
  for (auto& hp : hosts_) {
    if (hp->run == nullptr || hp->stopping) return false;
    const std::string state = hp->run->Status().state();
    if (state != "done" && state != "failed") return false;
  }
  return true;
}

bool RoundSim::CheckEnd() {
  for (auto& hp : hosts_) {
    const pb::ShardRunStatus st = hp->run->Status();
    result_.replays += st.replays();
    result_.replays_failed += st.replays() - st.replays_passed();
    // A replay may fail only on a Δ attacker: on an honest member it is a false accusation,
    // which only the lying validator makes.
    const bool attacker = static_cast<int>(&hp - &hosts_[0]) == attacker_;
    if (attacker) continue;
    if (!OwnWorkAttack() && st.replays_passed() != st.replays()) {
      return Violation(absl::StrCat(hp->address, " replayed ", st.replays(), " rounds and only ",
                                    st.replays_passed(), " reproduced an honest commitment"));
    }
    for (const std::string& t : st.transitions()) {
      if (t.find(": FAILED") == std::string::npos) continue;
      if (!OwnWorkAttack() ||
          t.find(sidecar::Short(hosts_[attacker_]->address)) == std::string::npos) {
        return Violation(absl::StrCat(hp->address, " accused an honest member: ", t));
      }
    }
    if (st.state() == "failed") {
      if (st.error().empty()) return Violation(absl::StrCat(hp->address, " failed saying nothing"));
      continue;
    }
    // After a partial settlement a member may stay behind the settled round (it stopped
    // training for the deadline and the others certified one more round without it).
    const uint64_t settled = result_.rounds_settled;
    const bool behind = settled < rounds_ && hp->checked_round < settled;
    if (!behind && (hp->checked_round != settled || hp->checked_root != settled_root_)) {
      return Violation(absl::StrCat(hp->address, " ends at round ", hp->checked_round,
                                    ", not on the settled root of round ", settled));
    }
  }
  return CheckMarks();
}

bool RoundSim::Attacked(const std::vector<pb::RoundCertificate>& certs) {
  // A round's failure is confirmed in the certificates of the two rounds after it (the drawn
  // validator's verdict, then the others'), when every round is replayed and no fault delays a
  // verdict past the run's last certificate: the last two rounds, and a run with faults, are
  // left out until the members close a run with rounds of verdicts only (not built,
  // docs/verification.md "Verdicts").
  if (!OwnWorkAttack() || options_.faults || spec_.spec.verification().replay_rate_bps() < 10000) {
    return false;
  }
  const std::string& address = hosts_[attacker_]->address;
  const SimHostState& state = net_.hosts().at(address);
  for (const pb::RoundCertificate& c : certs) {
    if (c.result().round() + 2 > result_.rounds_settled) continue;
    if (attack_ == Attack::kLyingEvaluator) {
      for (const pb::SignedEvaluation& e : c.evaluations()) {
        if (e.result().host() == address) return true;
      }
      continue;
    }
    const auto& members = c.result().members();
    if (std::find(members.begin(), members.end(), address) != members.end() &&
        state.attacked_rounds.contains(c.result().round())) {
      return true;
    }
  }
  return false;
}

bool RoundSim::HonestPaidRound(const std::vector<pb::RoundCertificate>& certs) {
  const std::string& address = hosts_[attacker_]->address;
  const SimHostState& state = net_.hosts().at(address);
  const uint64_t paid =
      sidecar::PaidRounds(spec_.spec.verification().replay_rate_bps(), result_.rounds_settled);
  for (const pb::RoundCertificate& c : certs) {
    const uint64_t round = c.result().round();
    if (round > paid || state.attacked_rounds.contains(round)) continue;
    for (const pb::Contribution& k : c.result().contributions()) {
      if (k.host() == address) return true;
    }
  }
  return false;
}

bool RoundSim::CheckMarks() {
  for (auto& hp : hosts_) {
    if (hp->run->Status().state() != "done") continue;
    auto view = hp->run_host.directory->Get(kShard);
    auto certs = sidecar::LoadStoredCertificates(*hp->run_host.db, kShard, 1, rounds_);
    if (!view.ok() || !certs.ok()) return Violation("sim: a settled host's records do not read");
    sidecar::VerdictTally tally(*view, spec_.spec.verification());
    for (const pb::RoundCertificate& c : *certs) tally.Add(c.result());
    for (size_t i = 0; i < hosts_.size(); ++i) {
      const uint32_t marks = tally.Marks(hosts_[i]->address);
      if (static_cast<int>(i) == Attacker()) {
        result_.attacker_marks = marks;
        result_.attacker_excluded = tally.Excluded(hosts_[i]->address);
      } else if (marks > 0) {
        return Violation(absl::StrCat("the honest host ", hosts_[i]->address, " has ", marks,
                                      " marks in the certificates"));
      }
    }
    if (Attacked(*certs) && (result_.attacker_marks == 0 || result_.attacker_paid > 0)) {
      return Violation(absl::StrCat("the attacker (", AttackName(attack_),
                                    ") tampered with a "
                                    "certified round's Δ and has ",
                                    result_.attacker_marks, " marks and was paid ",
                                    result_.attacker_paid));
    }
    if (result_.attacker_paid > 0 && UnpaidWhenAttacking() && !HonestPaidRound(*certs)) {
      return Violation(absl::StrCat("the attacker (", AttackName(attack_), ") was paid ",
                                    result_.attacker_paid,
                                    " with no untampered round among those a settlement pays"));
    }
    return true;
  }
  return true;
}

std::string RoundSim::DescribeHosts() {
  std::string out;
  for (auto& hp : hosts_) {
    absl::StrAppend(&out, "\n  ", hp->address.substr(0, 14), " weight ", hp->weight, ": ");
    if (hp->run == nullptr) {
      absl::StrAppend(&out, "down");
      continue;
    }
    const pb::ShardRunStatus st = hp->run->Status();
    absl::StrAppend(&out, st.state(), ", certified ", st.certified_round(), " ", st.error());
    const int n = st.transitions_size();
    for (int i = std::max(0, n - (options_.verbose ? 30 : 3)); i < n; ++i) {
      absl::StrAppend(&out, "\n    ", st.transitions(i));
    }
  }
  return out;
}

void RoundSim::Teardown() {
  for (auto& hp : hosts_) Kill(*hp, /*restart_after=*/-1);
  for (int i = 0; i < 1'000'000 && scheduler_.threads() > 0; ++i) scheduler_.Step();
  for (auto& hp : hosts_) {
    if (hp->run != nullptr) hp->run->Stop();
    hp->run.reset();
    hp->stopping = false;
  }
}

absl::StatusOr<pb::Shard> RoundSim::ChainShard(uint64_t id) const {
  pb::Shard shard;
  shard.set_id(id);
  shard.set_status(settled_    ? pb::SHARD_STATUS_SETTLED
                   : Expired() ? pb::SHARD_STATUS_EXPIRED
                               : pb::SHARD_STATUS_RUNNING);
  if (options_.deadline_ms > 0) shard.set_deadline_height(options_.deadline_ms / kSimBlockMs);
  shard.mutable_spec()->set_run_spec_hash(spec_.hash);
  shard.mutable_spec()->mutable_escrow()->set_denom("ngonka");
  shard.mutable_spec()->mutable_escrow()->set_amount(absl::StrCat(kEscrow));
  shard.mutable_spec()->mutable_reward_policy()->set_kind(pb::RewardPolicy::KIND_VERIFIED_WORK);
  shard.mutable_spec()->mutable_reward_policy()->set_max_host_share_bps(10000);
  return shard;
}

absl::StatusOr<pb::SettlementSignature> RoundSim::SignSettlement(Host& h,
                                                                 const pb::Settlement& draft) {
  TS_ASSIGN_OR_RETURN(pb::Settlement mine, sidecar::DraftFromRecords(h.run_host, kShard, spec_.spec,
                                                                     draft.rounds_completed()));
  const std::string bytes = DeterministicBytes(draft);
  if (DeterministicBytes(mine) != bytes) {
    return absl::FailedPreconditionError("sim: the draft is not what this host's records imply");
  }
  TS_ASSIGN_OR_RETURN(std::string sig, common::SignStatement(h.key, protocol::kSignSettlement,
                                                             kChainId, kShard, bytes));
  pb::SettlementSignature out;
  out.set_host(h.address);
  out.set_signature(sig);
  return out;
}

absl::StatusOr<std::string> RoundSim::Submit(const pb::Settlement& s,
                                             const std::vector<pb::SettlementSignature>& sigs) {
  if (settled_) return absl::FailedPreconditionError("sim chain: the shard is settled");
  if (Expired()) return absl::FailedPreconditionError("sim chain: the shard expired");
  const std::string bytes = DeterministicBytes(s);
  uint64_t weight = 0;
  std::vector<std::string> counted;
  for (const auto& sig : sigs) {
    auto signer = common::RecoverStatementSigner(protocol::kSignSettlement, kChainId, kShard, bytes,
                                                 sig.signature());
    const sidecar::ShardMember* m = view_.Find(sig.host());
    if (!signer.ok() || *signer != sig.host() || m == nullptr ||
        std::find(counted.begin(), counted.end(), sig.host()) != counted.end()) {
      continue;
    }
    counted.push_back(sig.host());
    weight += m->weight;
  }
  if (3 * static_cast<unsigned __int128>(weight) <=
      2 * static_cast<unsigned __int128>(total_weight_)) {
    return absl::FailedPreconditionError("sim chain: not more than 2/3 of the weight signed");
  }
  settled_ = true;
  settled_root_ = s.final_checkpoint_root();
  result_.rounds_settled = s.rounds_completed();
  result_.refund = std::stoull(s.refund());
  if (s.rounds_planned() != rounds_ || s.rounds_completed() > rounds_) {
    Violation(absl::StrCat("the settlement says ", s.rounds_completed(), " of ", s.rounds_planned(),
                           " rounds; the run has ", rounds_));
  }
  // A partial settlement pays at most its part of the escrow.
  if (kEscrow - result_.refund > protocol::PayableOf(kEscrow, s.rounds_completed(), rounds_)) {
    Violation(absl::StrCat("the settlement of ", s.rounds_completed(), " of ", rounds_,
                           " rounds pays ", kEscrow - result_.refund));
  }
  for (const pb::HostPayout& p : s.payouts()) {
    const bool attacker = Attacker() >= 0 && p.host() == hosts_[Attacker()]->address;
    (attacker ? result_.attacker_paid : result_.honest_paid) += std::stoull(p.amount());
    if (!attacker && p.marks() > 0) {
      Violation(absl::StrCat("the honest host ", p.host(), " is marked in the settlement"));
    }
  }
  Note(absl::StrCat("settled on ", common::HexEncode(settled_root_).substr(0, 16)));
  return common::Sha256(bytes);
}

SimResult RoundSim::Run() {
  if (absl::Status set = Setup(); !set.ok()) {
    Violation(absl::StrCat("setup: ", set.message()));
    return result_;
  }
  PlanFaults();
  for (auto& hp : hosts_) StartHost(*hp);
  const int64_t limit =
      (options_.faults ? options_.faults_until_ms : 0) + options_.settle_within_ms;
  if (!options_.faults) faults_over_ = true;
  uint64_t turns = 0;
  while (result_.ok) {
    if (!scheduler_.Step()) {
      // Every run is down: on to the next restart.
      int64_t next = INT64_MAX;
      for (auto& hp : hosts_) {
        if (hp->restart_at >= 0) next = std::min(next, hp->restart_at);
      }
      if (next == INT64_MAX) {
        Violation("no run is left and none is due back");
        break;
      }
      scheduler_.AdvanceTo(next);
    }
    const int64_t now = scheduler_.now();
    trace_ = Mix(trace_, static_cast<uint64_t>(now));
    ApplyFaults(now);
    Reap(now);
    for (auto& hp : hosts_) {
      if (!CheckRecords(*hp) || !CheckResume(*hp)) break;
    }
    if (!result_.ok) break;
    if (++turns % kCheckStatusEvery == 0 && Finished()) {
      CheckEnd();
      break;
    }
    if (now > limit) {
      Violation(absl::StrCat(
          "the shard has not settled ", options_.settle_within_ms, " ms after the faults stopped",
          settled_ ? " (settled on chain; a member is not done)" : "", DescribeHosts()));
    }
  }
  result_.events = scheduler_.events();
  result_.sim_ms = scheduler_.now();
  Teardown();
  result_.final_root = common::HexEncode(settled_root_);
  result_.trace = Mix(trace_, std::hash<std::string>{}(settled_root_));
  std::vector<std::string> counts;
  for (const auto& [kind, n] : fault_counts_) counts.push_back(absl::StrCat(kind, " ", n));
  result_.faults = absl::StrJoin(counts, ", ");
  return result_;
}

}  // namespace

namespace {
constexpr const char* kAttackNames[kAttackKinds] = {
    "none",        "free_rider", "copier", "lazy",       "noise",           "scale100",
    "sign_flip",   "alie",       "stale",  "wrong_data", "lying_validator", "lying_evaluator",
    "lying_scorer"};
}  // namespace

const char* AttackName(Attack a) { return kAttackNames[static_cast<int>(a)]; }

std::optional<Attack> ParseAttack(std::string_view name) {
  for (int i = 0; i < kAttackKinds; ++i) {
    if (std::string_view(kAttackNames[i]) == name) return static_cast<Attack>(i);
  }
  return std::nullopt;
}

SimResult RunRoundSim(const SimOptions& options) {
  common::SetLogLevel(common::LogLevel::kError);
  RoundSim sim(options);
  return sim.Run();
}

}  // namespace ts::sim
