// The Keeper's governance: proposals carrying shard specs (or, in the gonka-v0 profile, Gonka's
// MsgCreateTrainshardProposal), deposits, weighted votes, the tally at the end of voting and the
// execution of a passed proposal (contract in keeper.h).
#include <string>
#include <utility>
#include <vector>

#include "chain-bridge/module/gonka_v0.h"
#include "chain-bridge/module/keeper.h"
#include "chain-bridge/module/keeper_util.h"
#include "chain-bridge/module/proto_util.h"
#include "chain-bridge/module/str_cat.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/validation.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/protocol.h"
#include "common/status.h"

namespace ts::bridge {

using keeper_util::Invalid;
using keeper_util::KeyName;
using keeper_util::kPpm;
using keeper_util::Load;
using keeper_util::LoadU64;
using keeper_util::StoredAmount;
using keeper_util::u128;
using keeper_util::U128ToString;

namespace {

std::string VoteOptionName(cosmos::gov::v1::VoteOption option) {
  switch (option) {
    case cosmos::gov::v1::VOTE_OPTION_YES:
      return "yes";
    case cosmos::gov::v1::VOTE_OPTION_ABSTAIN:
      return "abstain";
    case cosmos::gov::v1::VOTE_OPTION_NO:
      return "no";
    case cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO:
      return "no_with_veto";
    default:
      return "unspecified";
  }
}

}  // namespace

absl::StatusOr<pb::Proposal> Keeper::GetProposal(uint64_t id) const {
  TS_ASSIGN_OR_RETURN(auto proposal, Load<pb::Proposal>(*kv_, keys::Proposal(id)));
  if (!proposal.has_value()) return absl::NotFoundError(Cat("proposal ", id, " not found"));
  return *std::move(proposal);
}

void Keeper::PutProposal(const pb::Proposal& proposal) {
  kv_->Set(keys::Proposal(proposal.id()), DeterministicBytes(proposal));
}

absl::StatusOr<uint64_t> Keeper::NextId(std::string_view key) {
  TS_ASSIGN_OR_RETURN(uint64_t id, LoadU64(*kv_, key, 1));
  kv_->Set(key, Be64(id + 1));
  return id;
}

absl::Status Keeper::SubmitProposal(const cosmos::gov::v1::MsgSubmitProposal& msg) {
  TS_RETURN_IF_ERROR(ValidateAddress("proposer", msg.proposer()));
  if (msg.title().size() > kMaxProposalTitleBytes) {
    return Invalid("title", msg.title().size(), " bytes exceed ", kMaxProposalTitleBytes);
  }
  if (msg.summary().size() > kMaxProposalSummaryBytes) {
    return Invalid("summary", msg.summary().size(), " bytes exceed ", kMaxProposalSummaryBytes);
  }
  if (msg.metadata().size() > kMaxMetadataBytes) {
    return Invalid("metadata", msg.metadata().size(), " bytes exceed ", kMaxMetadataBytes);
  }
  TS_ASSIGN_OR_RETURN(uint64_t deposit,
                      ParseCoins("initial_deposit", msg.initial_deposit(), /*positive=*/false));
  if (deposit < env_.min_deposit) {
    return Invalid("initial_deposit", deposit, " is below min_deposit ", env_.min_deposit);
  }
  if (msg.messages_size() < 1 || msg.messages_size() > kMaxProposalMessages) {
    return Invalid("messages", msg.messages_size(), " messages, want 1..", kMaxProposalMessages);
  }
  if (env_.gonka_v0 != nullptr) return SubmitGonkaProposal(msg, deposit);
  std::vector<pb::MsgCreateTrainshardProposal> creates(static_cast<size_t>(msg.messages_size()));
  for (int i = 0; i < msg.messages_size(); ++i) {
    std::string field = Cat("messages[", i, "]");
    const auto& any = msg.messages(i);
    if (any.type_url() != kMsgCreateTrainshardProposalType) {
      return Invalid(Cat(field, ".type_url"), "'", any.type_url().substr(0, 128), "' is not ",
                     kMsgCreateTrainshardProposalType);
    }
    auto& create = creates[static_cast<size_t>(i)];
    TS_RETURN_IF_ERROR(ParseMessageStrict(field, any.value(), &create));
    if (create.authority() != env_.gov_address) {
      return Invalid(Cat(field, ".authority"), "'", create.authority().substr(0, 128),
                     "' is not the gov account ", env_.gov_address);
    }
    if (create.creator() != msg.proposer()) {
      return Invalid(Cat(field, ".creator"), "'", create.creator().substr(0, 128),
                     "' is not the proposer ", msg.proposer());
    }
    absl::Status spec_ok = ValidateSpec(create.spec(), params());
    if (!spec_ok.ok()) return Invalid(field, spec_ok.message());
  }
  std::vector<google::protobuf::Any> packed;
  for (const auto& create : creates) packed.push_back(PackMsg(create));
  TS_ASSIGN_OR_RETURN(pb::Proposal proposal, OpenVoting(msg, deposit, std::move(packed)));
  const uint64_t id = proposal.id();

  for (const auto& create : creates) {
    TS_ASSIGN_OR_RETURN(uint64_t shard_id, NextId(keys::kNextShardId));
    if (proposal.shard_id() == 0) proposal.set_shard_id(shard_id);
    pb::Shard shard;
    shard.set_id(shard_id);
    *shard.mutable_spec() = create.spec();
    shard.set_creator(create.creator());
    shard.set_status(pb::SHARD_STATUS_PROPOSED);
    shard.set_proposal_id(id);
    shard.set_proposed_height(height_);
    shard.set_escrow_held("0");
    PutShard(shard);
    kv_->Set(keys::MemberCount(shard_id), Be64(0));
    Emit(protocol::kEventShardProposed, {{"shard_id", Cat(shard_id)},
                                         {"proposal_id", Cat(id)},
                                         {"creator", create.creator()},
                                         {"hardware_profile", create.spec().hardware_profile()},
                                         {"max_nodes", Cat(create.spec().max_nodes())},
                                         {"escrow", create.spec().escrow().amount()}});
  }
  PutProposal(proposal);
  return absl::OkStatus();
}

absl::Status Keeper::SubmitGonkaProposal(const cosmos::gov::v1::MsgSubmitProposal& msg,
                                         uint64_t deposit) {
  // Gonka's proposal messages are checked as its gov checks them at submission (the authority),
  // and in full when they execute, as Gonka's keeper does.
  std::vector<gv0::MsgCreateTrainshardProposal> creates(static_cast<size_t>(msg.messages_size()));
  for (int i = 0; i < msg.messages_size(); ++i) {
    std::string field = Cat("messages[", i, "]");
    const auto& any = msg.messages(i);
    if (any.type_url() != kGonkaCreateProposalType) {
      return Invalid(Cat(field, ".type_url"), "'", any.type_url().substr(0, 128), "' is not ",
                     kGonkaCreateProposalType, " (this chain runs Gonka's trainshards v0)");
    }
    auto& create = creates[static_cast<size_t>(i)];
    TS_RETURN_IF_ERROR(ParseMessageStrict(field, any.value(), &create));
    if (create.authority() != env_.gov_address) {
      return Invalid(Cat(field, ".authority"), "'", create.authority().substr(0, 128),
                     "' is not the gov account ", env_.gov_address);
    }
    TS_RETURN_IF_ERROR(ValidateAddress(Cat(field, ".creator"), create.creator()));
  }
  std::vector<google::protobuf::Any> packed;
  for (const auto& create : creates) packed.push_back(PackMsg(create));
  TS_ASSIGN_OR_RETURN(pb::Proposal proposal, OpenVoting(msg, deposit, std::move(packed)));
  PutProposal(proposal);
  return absl::OkStatus();
}

absl::StatusOr<pb::Proposal> Keeper::OpenVoting(const cosmos::gov::v1::MsgSubmitProposal& msg,
                                                uint64_t deposit,
                                                std::vector<google::protobuf::Any> messages) {
  TS_RETURN_IF_ERROR(Transfer(msg.proposer(), env_.gov_address, deposit));
  TS_ASSIGN_OR_RETURN(uint64_t id, NextId(keys::kNextProposalId));
  TS_ASSIGN_OR_RETURN(uint64_t epoch, EpochInForce(height_));
  TS_ASSIGN_OR_RETURN(pb::EpochWeights weights, GetEpochWeights(epoch, /*with_weights=*/false));
  pb::Proposal proposal;
  proposal.set_id(id);
  proposal.set_proposer(msg.proposer());
  proposal.set_title(msg.title());
  proposal.set_summary(msg.summary());
  for (auto& message : messages) *proposal.add_messages() = std::move(message);
  proposal.set_status(pb::PROPOSAL_STATUS_VOTING_PERIOD);
  proposal.set_submit_height(height_);
  proposal.set_voting_end_height(height_ + static_cast<int64_t>(params().voting_period_blocks()));
  proposal.set_deposit(Cat(deposit));
  proposal.set_weight_epoch(epoch);
  proposal.set_total_weight(weights.total_weight());
  if (deposit > 0) kv_->Set(keys::Deposit(id, msg.proposer()), Be64(deposit));
  kv_->Set(keys::VotingEnd(proposal.voting_end_height(), id), "");
  Emit("gov.proposal_submitted", {{"proposal_id", Cat(id)},
                                  {"proposer", msg.proposer()},
                                  {"voting_end_height", Cat(proposal.voting_end_height())}});
  return proposal;
}

absl::Status Keeper::Vote(const cosmos::gov::v1::MsgVote& msg) {
  TS_RETURN_IF_ERROR(ValidateAddress("voter", msg.voter()));
  if (msg.metadata().size() > kMaxMetadataBytes) {
    return Invalid("metadata", msg.metadata().size(), " bytes exceed ", kMaxMetadataBytes);
  }
  TS_ASSIGN_OR_RETURN(pb::Proposal proposal, GetProposal(msg.proposal_id()));
  if (proposal.status() != pb::PROPOSAL_STATUS_VOTING_PERIOD ||
      height_ > proposal.voting_end_height()) {
    return absl::FailedPreconditionError(Cat("proposal ", proposal.id(),
                                             " is not in its voting period (ended at height ",
                                             proposal.voting_end_height(), ")"));
  }
  TS_ASSIGN_OR_RETURN(uint64_t weight, Weight(proposal.weight_epoch(), msg.voter()));
  if (weight == 0) {
    return absl::PermissionDeniedError(
        Cat("voter ", msg.voter(), " has no weight in epoch ", proposal.weight_epoch()));
  }
  if (msg.option() < cosmos::gov::v1::VOTE_OPTION_YES ||
      msg.option() > cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO) {
    return Invalid("option", static_cast<int>(msg.option()),
                   " is not yes, abstain, no or no_with_veto");
  }
  // A second vote replaces the first: one key per (proposal, voter).
  kv_->Set(keys::Vote(proposal.id(), msg.voter()), std::string(1, static_cast<char>(msg.option())));
  Emit("gov.vote", {{"proposal_id", Cat(proposal.id())},
                    {"voter", msg.voter()},
                    {"option", VoteOptionName(msg.option())},
                    {"weight", Cat(weight)}});
  return absl::OkStatus();
}

absl::Status Keeper::Deposit(const cosmos::gov::v1::MsgDeposit& msg) {
  TS_RETURN_IF_ERROR(ValidateAddress("depositor", msg.depositor()));
  TS_ASSIGN_OR_RETURN(uint64_t amount, ParseCoins("amount", msg.amount(), /*positive=*/true));
  TS_ASSIGN_OR_RETURN(pb::Proposal proposal, GetProposal(msg.proposal_id()));
  if (proposal.status() != pb::PROPOSAL_STATUS_VOTING_PERIOD ||
      height_ > proposal.voting_end_height()) {
    return absl::FailedPreconditionError(Cat("proposal ", proposal.id(),
                                             " is not in its voting period (ended at height ",
                                             proposal.voting_end_height(), ")"));
  }
  TS_RETURN_IF_ERROR(Transfer(msg.depositor(), env_.gov_address, amount));
  std::string key = keys::Deposit(proposal.id(), msg.depositor());
  TS_ASSIGN_OR_RETURN(uint64_t previous, LoadU64(*kv_, key, 0));
  TS_ASSIGN_OR_RETURN(uint64_t total_deposit, StoredAmount("proposal.deposit", proposal.deposit()));
  // Bounded by the total supply, which fits in uint64.
  kv_->Set(key, Be64(previous + amount));
  proposal.set_deposit(Cat(total_deposit + amount));
  PutProposal(proposal);
  return absl::OkStatus();
}

absl::Status Keeper::RefundDeposits(uint64_t proposal_id, bool to_community_pool) {
  std::string prefix = Cat(keys::kDepositPrefix, Be64(proposal_id));
  for (const auto& [key, value] : kv_->Scan(prefix)) {
    TS_ASSIGN_OR_RETURN(uint64_t amount, ReadBe64(key, value));
    std::string depositor = key.substr(prefix.size());
    TS_RETURN_IF_ERROR(Transfer(
        env_.gov_address, to_community_pool ? env_.community_pool_address : depositor, amount));
    kv_->Delete(key);
  }
  return absl::OkStatus();
}

absl::Status Keeper::Tally(uint64_t proposal_id) {
  TS_ASSIGN_OR_RETURN(pb::Proposal proposal, GetProposal(proposal_id));
  if (proposal.status() != pb::PROPOSAL_STATUS_VOTING_PERIOD) return absl::OkStatus();
  uint64_t yes = 0, no = 0, abstain = 0, veto = 0;
  std::string prefix = Cat(keys::kVotePrefix, Be64(proposal_id));
  for (const auto& [key, value] : kv_->Scan(prefix)) {
    std::string voter = key.substr(prefix.size());
    TS_ASSIGN_OR_RETURN(uint64_t weight, Weight(proposal.weight_epoch(), voter));
    int option = value.size() == 1 ? static_cast<uint8_t>(value[0]) : -1;
    // Sums are bounded by the epoch's total weight, which fits in uint64.
    switch (option) {
      case cosmos::gov::v1::VOTE_OPTION_YES:
        yes += weight;
        break;
      case cosmos::gov::v1::VOTE_OPTION_ABSTAIN:
        abstain += weight;
        break;
      case cosmos::gov::v1::VOTE_OPTION_NO:
        no += weight;
        break;
      case cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO:
        veto += weight;
        break;
      default:
        return absl::DataLossError(Cat("state key ", KeyName(key), ": bad vote option"));
    }
    kv_->Delete(key);
  }
  kv_->Delete(keys::VotingEnd(proposal.voting_end_height(), proposal_id));
  auto* tally = proposal.mutable_final_tally();
  tally->set_yes(yes);
  tally->set_no(no);
  tally->set_abstain(abstain);
  tally->set_no_with_veto(veto);

  u128 voted = u128{yes} + no + abstain + veto;
  u128 total = proposal.total_weight();
  std::string status;
  std::string reason;
  if (voted * kPpm < u128{params().quorum_ppm()} * total) {
    proposal.set_status(pb::PROPOSAL_STATUS_REJECTED);
    status = "rejected";
    reason = "quorum_not_reached";
    TS_RETURN_IF_ERROR(RefundDeposits(proposal_id, /*to_community_pool=*/false));
  } else if (u128{veto} * kPpm > u128{params().veto_threshold_ppm()} * voted) {
    proposal.set_status(pb::PROPOSAL_STATUS_REJECTED);
    status = "rejected";
    reason = "vetoed";
    TS_RETURN_IF_ERROR(RefundDeposits(proposal_id, /*to_community_pool=*/true));
  } else if (u128{yes} * kPpm > u128{params().threshold_ppm()} * (voted - abstain)) {
    TS_RETURN_IF_ERROR(RefundDeposits(proposal_id, /*to_community_pool=*/false));
    // The proposal's messages run atomically in a branch, as Cosmos runs a passed proposal.
    KvOverlay branch(kv_);
    Events branch_events;
    Keeper executor(env_, &branch, height_, &branch_events);
    absl::Status executed = executor.ExecuteProposal(proposal);
    if (executed.ok()) {
      branch.Commit();
      for (auto& event : branch_events) events_->push_back(std::move(event));
      proposal.set_status(pb::PROPOSAL_STATUS_PASSED);
      status = "passed";
      reason = "passed";
    } else if (absl::IsFailedPrecondition(executed)) {
      proposal.set_status(pb::PROPOSAL_STATUS_FAILED);
      proposal.set_failed_reason(std::string(executed.message()));
      status = "failed";
      reason = env_.gonka_v0 != nullptr ? Cat("failed: ", executed.message())
                                        : Cat("escrow_unfunded: ", executed.message());
    } else {
      return executed;
    }
  } else {
    proposal.set_status(pb::PROPOSAL_STATUS_REJECTED);
    status = "rejected";
    reason = "threshold_not_reached";
    TS_RETURN_IF_ERROR(RefundDeposits(proposal_id, /*to_community_pool=*/false));
  }

  // A Gonka proposal made no shard records at submission: there is nothing to reject.
  if (proposal.status() != pb::PROPOSAL_STATUS_PASSED && env_.gonka_v0 == nullptr) {
    bool unfunded = proposal.status() == pb::PROPOSAL_STATUS_FAILED;
    for (int i = 0; i < proposal.messages_size(); ++i) {
      uint64_t shard_id = proposal.shard_id() + static_cast<uint64_t>(i);
      TS_ASSIGN_OR_RETURN(pb::Shard shard, GetShard(shard_id, false));
      shard.set_status(pb::SHARD_STATUS_REJECTED);
      shard.set_close_reason(unfunded ? pb::CLOSE_REASON_ESCROW_UNFUNDED
                                      : pb::CLOSE_REASON_REJECTED);
      shard.set_closed_height(height_);
      PutShard(shard);
      Emit(protocol::kEventShardRejected,
           {{"shard_id", Cat(shard_id)},
            {"reason", unfunded ? "escrow_unfunded" : "proposal_rejected"}});
    }
  }
  PutProposal(proposal);
  Emit("gov.proposal_finalized", {{"proposal_id", Cat(proposal_id)},
                                  {"status", status},
                                  {"yes", Cat(yes)},
                                  {"no", Cat(no)},
                                  {"abstain", Cat(abstain)},
                                  {"no_with_veto", Cat(veto)},
                                  {"reason", reason}});
  return absl::OkStatus();
}

absl::Status Keeper::ExecuteProposal(const pb::Proposal& proposal) {
  if (env_.gonka_v0 != nullptr) {
    GonkaV0Keeper gonka(*env_.gonka_v0, kv_, height_, events_);
    for (int i = 0; i < proposal.messages_size(); ++i) {
      gv0::MsgCreateTrainshardProposal create;
      if (!proposal.messages(i).UnpackTo(&create)) {
        return absl::DataLossError(Cat("proposal ", proposal.id(), ": messages[", i,
                                       "] does not parse as ", kGonkaCreateProposalType));
      }
      auto created = gonka.CreateProposal(create);
      // A message its keeper refuses fails the proposal (as a failed message fails a Cosmos
      // proposal); only a corrupted state stops the block.
      if (!created.ok() && !absl::IsDataLoss(created.status())) {
        return absl::FailedPreconditionError(
            Cat("messages[", i, "]: ", created.status().message()));
      }
      TS_RETURN_IF_ERROR(created.status());
    }
    return absl::OkStatus();
  }
  for (int i = 0; i < proposal.messages_size(); ++i) {
    uint64_t shard_id = proposal.shard_id() + static_cast<uint64_t>(i);
    TS_ASSIGN_OR_RETURN(pb::Shard shard, GetShard(shard_id, false));
    TS_ASSIGN_OR_RETURN(uint64_t escrow,
                        StoredAmount("spec.escrow.amount", shard.spec().escrow().amount()));
    absl::Status paid = Transfer(shard.creator(), env_.escrow_address, escrow);
    if (!paid.ok()) {
      return absl::Status(paid.code(), Cat("shard ", shard_id, ": ", paid.message()));
    }
    shard.set_status(pb::SHARD_STATUS_OPEN);
    shard.set_open_height(height_);
    shard.set_reservation_deadline_height(
        height_ + static_cast<int64_t>(shard.spec().reservation_window_blocks()));
    shard.set_deadline_height(height_ + static_cast<int64_t>(shard.spec().max_duration_blocks()));
    shard.set_escrow_held(Cat(escrow));
    PutShard(shard);
    kv_->Set(keys::ReservationDeadline(shard.reservation_deadline_height(), shard_id), "");
    kv_->Set(keys::Deadline(shard.deadline_height(), shard_id), "");
    Emit(protocol::kEventShardOpened,
         {{"shard_id", Cat(shard_id)},
          {"creator", shard.creator()},
          {"hardware_profile", shard.spec().hardware_profile()},
          {"min_nodes", Cat(shard.spec().min_nodes())},
          {"max_nodes", Cat(shard.spec().max_nodes())},
          {"min_host_weight", Cat(shard.spec().min_host_weight())},
          {"escrow", Cat(escrow)},
          {"reservation_deadline_height", Cat(shard.reservation_deadline_height())},
          {"deadline_height", Cat(shard.deadline_height())}});
  }
  return absl::OkStatus();
}

}  // namespace ts::bridge
