#include "sidecar/shard/settlement_exchange.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/amount.h"
#include "common/crypto/signing.h"
#include "common/protocol.h"
#include "proto/deterministic.h"
#include "sidecar/shard/ledger.h"
#include "sidecar/shard/round_certificate.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
// The other members' wait for the first member's submission before submitting themselves.
constexpr int64_t kSubmitGraceMs = 15000;
constexpr int64_t kChainPollMs = 500;
// How long a member without a settlement to wait for (no signatures, or refused) waits for
// another member's to land before the members exchange signatures again.
constexpr int64_t kSettleGiveUpMs = 45'000;

}  // namespace

bool SettlementExchange::Exchange(Collective* collective, const GroupSpec& group, int64_t deadline,
                                  uint64_t rounds) {
  auto draft = DraftFromRecords(run_.host, run_.shard_id, run_.spec.spec, rounds);
  if (!draft.ok()) {
    run_.Transition(absl::StrCat("settlement not drafted: ", draft.status().message()));
    return false;
  }
  settlement_ = *draft;
  auto signed_draft = run_.host.sign_settlement(*draft);
  pb::SettlementSignature mine;
  if (signed_draft.ok()) {
    mine = *signed_draft;
  } else {
    run_.Transition(absl::StrCat("settlement not signed: ", signed_draft.status().message()));
  }
  auto block = PackBlock(mine, kSettlementBlockBytes);
  if (!block.ok()) return false;
  std::string gathered(kSettlementBlockBytes * group.members.size(), '\0');
  OpOptions op;
  op.op_id = 4;
  op.deadline_ms = deadline;
  signatures_.clear();
  if (auto s = collective->AllGather(op, *block, gathered); !s.ok()) {
    run_.Transition(absl::StrCat("settlement signatures not exchanged: ", s.status().message()));
    return false;
  }
  const std::string bytes = DeterministicBytes(*draft);
  for (size_t i = 0; i < group.members.size(); ++i) {
    pb::SettlementSignature s;
    if (!UnpackBlock(
            std::string_view(gathered).substr(i * kSettlementBlockBytes, kSettlementBlockBytes),
            &s)) {
      continue;
    }
    auto signer = common::RecoverStatementSigner(protocol::kSignSettlement, run_.host.chain_id,
                                                 run_.shard_id, bytes, s.signature());
    if (signer.ok() && *signer == s.host() && s.host() == group.members[i].address) {
      signatures_.push_back(s);
    }
  }
  run_.Transition(absl::StrCat(
      "settlement drafted: final root ", Hex8(draft->final_checkpoint_root()), ", eval loss ",
      draft->evaluation().value_micro() / 1e6, ", ", signatures_.size(), " signatures gathered"));
  absl::MutexLock lock(&run_.mu);
  *run_.status.mutable_settlement() = *draft;
  return !signatures_.empty();
}

bool SettlementExchange::Settle(bool first_member) {
  run_.SetState("settling");
  {
    absl::MutexLock lock(&run_.mu);
    run_.can_plan = false;
  }
  const int64_t start = run_.host.clock->MonotonicMs();
  bool submitted = false;
  bool accepted = false;
  while (!run_.stopping) {
    auto shard = run_.host.chain_shard(run_.shard_id);
    if (shard.ok() && shard->status() == pb::SHARD_STATUS_SETTLED) {
      run_.Transition("shard settled on chain");
      run_.SetState("done");
      return true;
    }
    if (shard.ok() && shard->status() != pb::SHARD_STATUS_RUNNING) {
      run_.Transition(absl::StrCat("shard is ", pb::ShardStatus_Name(shard->status())));
      run_.SetState("done");
      return true;
    }
    const bool due = first_member || !run_.host.settles_on_chain ||
                     run_.host.clock->MonotonicMs() - start > kSubmitGraceMs;
    if (!submitted && due && !signatures_.empty()) {
      auto tx = run_.host.submit_settlement(settlement_, signatures_);
      submitted = true;
      accepted = tx.ok();
      if (tx.ok() && tx->empty()) {
        // A chain whose creator settles (gonka-v0): the signed settlement stays with the
        // members, and the run waits for the creator's settle to close the shard.
        run_.Transition("settlement kept off chain; waiting for the creator to settle the shard");
      } else if (tx.ok()) {
        run_.Transition(absl::StrCat("settlement submitted, tx ", tx->substr(0, 16)));
        absl::MutexLock lock(&run_.mu);
        run_.status.set_settlement_txhash(*tx);
      } else {
        run_.Transition(absl::StrCat("settlement submission refused: ", tx.status().message()));
      }
    }
    if (!accepted && run_.host.clock->MonotonicMs() - start > kSettleGiveUpMs) {
      run_.Transition("no settlement landed; the members exchange their signatures again");
      return false;
    }
    run_.Sleep(kChainPollMs);
  }
  return true;
}

absl::StatusOr<pb::Settlement> DraftFromRecords(const ShardRunHost& host, uint64_t shard_id,
                                                const pb::RunSpec& spec, uint64_t rounds) {
  if (rounds < 1 || rounds > spec.rounds()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rounds: ", rounds, " is outside 1..", spec.rounds(), " (the run's)"));
  }
  TS_ASSIGN_OR_RETURN(std::vector<pb::RoundCertificate> certs,
                      // At most a validated run spec's rounds (100,000).
                      LoadStoredCertificates(*host.db, shard_id, 1, static_cast<uint32_t>(rounds)));
  if (certs.size() != rounds || certs.back().result().round() != rounds) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, ": this host's records certify ", certs.size(), " of ",
                     rounds, " rounds; the run has not got that far here"));
  }
  TS_ASSIGN_OR_RETURN(pb::Shard shard, host.chain_shard(shard_id));
  TS_ASSIGN_OR_RETURN(uint64_t escrow,
                      common::ParseAmount("shard.spec.escrow", shard.spec().escrow().amount()));
  TS_ASSIGN_OR_RETURN(ShardView view, host.directory->Get(shard_id));
  return DraftSettlement(host.chain_id, view, escrow, shard.spec().reward_policy(),
                         spec.verification(), certs, spec.rounds());
}

}  // namespace ts::sidecar
