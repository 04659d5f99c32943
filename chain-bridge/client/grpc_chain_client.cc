// GrpcChainClient: ChainClient over the Cosmos gRPC services and the module's Query service.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/client/comet_rpc.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/status.h"
#include "cosmos/auth/v1beta1/auth.pb.h"
#include "cosmos/auth/v1beta1/query.grpc.pb.h"
#include "cosmos/bank/v1beta1/query.grpc.pb.h"
#include "gonka/trainshard/v1/chain.grpc.pb.h"
#include "proto/cosmos_tx_service.h"
#include "proto/grpc_status.h"

namespace ts::bridge {
namespace {

using cosmos::base::abci::v1beta1::TxResponse;

// Largest response accepted: a block of GetBlockWithTxs with its page of decoded txs.
constexpr int kMaxReceiveBytes = 16 << 20;
// Shards() pages through Query/Shards; this bounds the loop against a misbehaving server.
constexpr int kShardPagesMax = 1000;
constexpr uint32_t kShardsPage = 100;
// Longest pause between two GetTx polls while waiting for inclusion.
constexpr int64_t kPollIntervalMaxMs = 250;

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

bool LogSays(const TxResponse& r, std::string_view words) {
  return absl::AsciiStrToLower(r.raw_log()).find(words) != std::string::npos;
}

// The module refuses a tx whose signer sequence is not the expected one with a log naming the
// sequence (docs/protocol.md); Cosmos SDK nodes answer code 32 in codespace "sdk".
bool IsSequenceMismatch(const TxResponse& r) {
  if (r.code() == 0) return false;
  if (r.codespace() == "sdk" && r.code() == 32) return true;
  return LogSays(r, "sequence mismatch");
}

// The same bytes were already accepted (a retry after a lost answer): the SDK's code 19.
bool IsAlreadyQueued(const TxResponse& r) { return r.codespace() == "sdk" && r.code() == 19; }

// A refused simulation as a response: the devnet ends its error with "(codespace C, code N)"
// (RefusalMessage); another node's error is reported with code 1 (the SDK's "internal").
TxResponse SimulationRefused(const absl::Status& status) {
  TxResponse r;
  std::string log;
  TxCode code;
  absl::string_view message = status.message();
  if (ParseRefusalMessage(std::string_view(message.data(), message.size()), &log, &code)) {
    r.set_codespace(code.codespace);
    r.set_code(code.code);
    r.set_raw_log(log);
  } else {
    r.set_code(1);
    r.set_raw_log(std::string(message));
  }
  return r;
}

class GrpcChainClient final : public ChainClient {
 public:
  GrpcChainClient(std::shared_ptr<grpc::Channel> channel, ChainClientOptions options)
      : options_(options), channel_(std::move(channel)) {
    tx_ = std::make_unique<cosmos::tx::v1beta1::TxServiceStub>(channel_);
    auth_ = cosmos::auth::v1beta1::Query::NewStub(channel_);
    bank_ = cosmos::bank::v1beta1::Query::NewStub(channel_);
    module_ = pb::Query::NewStub(channel_);
  }

  absl::StatusOr<ChainStatus> Status() override {
    pb::QueryStatusResponse resp;
    TS_RETURN_IF_ERROR(Call("Query/Status", [&](grpc::ClientContext* ctx) {
      return module_->Status(ctx, pb::QueryStatusRequest(), &resp);
    }));
    ChainStatus out;
    out.chain_id = resp.chain_id();
    out.latest_height = resp.latest_height();
    out.app_hash = resp.app_hash();
    out.epoch = resp.epoch();
    return out;
  }

  absl::StatusOr<std::vector<tendermint::abci::Event>> EventsAt(int64_t height) override {
    if (!options_.rpc_target.empty()) {
      return CometBlockEvents(options_.rpc_target, height, options_.call_timeout_ms);
    }
    pb::QueryBlockEventsRequest req;
    req.set_height(height);
    pb::QueryBlockEventsResponse resp;
    TS_RETURN_IF_ERROR(Call("Query/BlockEvents", [&](grpc::ClientContext* ctx) {
      return module_->BlockEvents(ctx, req, &resp);
    }));
    return std::vector<tendermint::abci::Event>(resp.events().begin(), resp.events().end());
  }

  absl::StatusOr<AccountInfo> Account(const std::string& address) override {
    cosmos::auth::v1beta1::QueryAccountRequest req;
    req.set_address(address);
    cosmos::auth::v1beta1::QueryAccountResponse resp;
    TS_RETURN_IF_ERROR(Call("auth.Query/Account", [&](grpc::ClientContext* ctx) {
      return auth_->Account(ctx, req, &resp);
    }));
    cosmos::auth::v1beta1::BaseAccount account;
    if (resp.account().type_url() != "/cosmos.auth.v1beta1.BaseAccount" ||
        !account.ParseFromString(resp.account().value())) {
      return absl::DataLossError(absl::StrCat("auth.Query/Account: account of type \"",
                                              resp.account().type_url(),
                                              "\" is not a parsable BaseAccount"));
    }
    return AccountInfo{account.account_number(), account.sequence()};
  }

  absl::StatusOr<uint64_t> Balance(const std::string& address) override {
    cosmos::bank::v1beta1::QueryBalanceRequest req;
    req.set_address(address);
    req.set_denom(std::string(common::kDenom));
    cosmos::bank::v1beta1::QueryBalanceResponse resp;
    TS_RETURN_IF_ERROR(Call("bank.Query/Balance", [&](grpc::ClientContext* ctx) {
      return bank_->Balance(ctx, req, &resp);
    }));
    absl::StatusOr<uint64_t> amount =
        common::ParseAmount("balance.amount", resp.balance().amount());
    if (!amount.ok()) return absl::DataLossError(amount.status().message());
    return *amount;
  }

  absl::StatusOr<pb::Shard> Shard(uint64_t shard_id) override {
    pb::QueryShardRequest req;
    req.set_shard_id(shard_id);
    pb::QueryShardResponse resp;
    TS_RETURN_IF_ERROR(Call(
        "Query/Shard", [&](grpc::ClientContext* ctx) { return module_->Shard(ctx, req, &resp); }));
    return resp.shard();
  }

  absl::StatusOr<std::vector<pb::Shard>> Shards(pb::ShardStatus status) override {
    std::vector<pb::Shard> out;
    uint64_t start_after = 0;
    for (int page = 0; page < kShardPagesMax; ++page) {
      pb::QueryShardsRequest req;
      req.set_status(status);
      req.set_start_after_id(start_after);
      req.set_limit(kShardsPage);
      pb::QueryShardsResponse resp;
      TS_RETURN_IF_ERROR(Call("Query/Shards", [&](grpc::ClientContext* ctx) {
        return module_->Shards(ctx, req, &resp);
      }));
      for (const pb::Shard& s : resp.shards()) {
        if (s.id() <= start_after) {
          return absl::DataLossError(
              absl::StrCat("Query/Shards: shard ", s.id(), " is not after ", start_after));
        }
        start_after = s.id();
        out.push_back(s);
      }
      if (resp.shards_size() < static_cast<int>(kShardsPage)) return out;
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("Query/Shards: more than ", kShardPagesMax, " pages of shards"));
  }

  absl::StatusOr<pb::EpochWeights> Weights(uint64_t epoch, bool current) override {
    pb::QueryWeightsRequest req;
    req.set_epoch(epoch);
    req.set_current(current);
    pb::QueryWeightsResponse resp;
    TS_RETURN_IF_ERROR(Call("Query/Weights", [&](grpc::ClientContext* ctx) {
      return module_->Weights(ctx, req, &resp);
    }));
    return resp.weights();
  }

  absl::StatusOr<pb::Proposal> Proposal(uint64_t proposal_id) override {
    pb::QueryProposalRequest req;
    req.set_proposal_id(proposal_id);
    pb::QueryProposalResponse resp;
    TS_RETURN_IF_ERROR(Call("Query/Proposal", [&](grpc::ClientContext* ctx) {
      return module_->Proposal(ctx, req, &resp);
    }));
    return resp.proposal();
  }

  absl::StatusOr<pb::QueryEscrowResponse> Escrow(uint64_t shard_id) override {
    pb::QueryEscrowRequest req;
    req.set_shard_id(shard_id);
    pb::QueryEscrowResponse resp;
    TS_RETURN_IF_ERROR(Call("Query/Escrow", [&](grpc::ClientContext* ctx) {
      return module_->Escrow(ctx, req, &resp);
    }));
    return resp;
  }

  absl::StatusOr<pb::SettlementRecord> Settlement(uint64_t shard_id) override {
    pb::QuerySettlementRequest req;
    req.set_shard_id(shard_id);
    pb::QuerySettlementResponse resp;
    TS_RETURN_IF_ERROR(Call("Query/Settlement", [&](grpc::ClientContext* ctx) {
      return module_->Settlement(ctx, req, &resp);
    }));
    return resp.record();
  }

  absl::StatusOr<pb::QueryParamsResponse> Params() override {
    pb::QueryParamsResponse resp;
    TS_RETURN_IF_ERROR(Call("Query/Params", [&](grpc::ClientContext* ctx) {
      return module_->Params(ctx, pb::QueryParamsRequest(), &resp);
    }));
    return resp;
  }

  absl::StatusOr<TxResponse> BroadcastRaw(const std::string& tx_bytes) override {
    cosmos::tx::v1beta1::BroadcastTxRequest req;
    req.set_tx_bytes(tx_bytes);
    req.set_mode(cosmos::tx::v1beta1::BROADCAST_MODE_SYNC);
    cosmos::tx::v1beta1::BroadcastTxResponse resp;
    TS_RETURN_IF_ERROR(Call("tx.Service/BroadcastTx", [&](grpc::ClientContext* ctx) {
      return tx_->BroadcastTx(ctx, req, &resp);
    }));
    return resp.tx_response();
  }

  absl::StatusOr<TxResponse> Simulate(const std::string& tx_bytes) override {
    cosmos::tx::v1beta1::SimulateRequest req;
    req.set_tx_bytes(tx_bytes);
    cosmos::tx::v1beta1::SimulateResponse resp;
    absl::Status status = Call("tx.Service/Simulate", [&](grpc::ClientContext* ctx) {
      return tx_->Simulate(ctx, req, &resp);
    });
    if (absl::IsInvalidArgument(status) || absl::IsUnknown(status)) {
      return SimulationRefused(status);
    }
    TS_RETURN_IF_ERROR(status);
    TxResponse r;
    r.set_gas_wanted(static_cast<int64_t>(resp.gas_info().gas_wanted()));
    r.set_gas_used(static_cast<int64_t>(resp.gas_info().gas_used()));
    for (const auto& event : resp.result().events()) *r.add_events() = event;
    return r;
  }

  absl::StatusOr<TxResponse> GetTx(const std::string& txhash) override {
    cosmos::tx::v1beta1::GetTxRequest req;
    req.set_hash(txhash);
    cosmos::tx::v1beta1::GetTxResponse resp;
    TS_RETURN_IF_ERROR(Call("tx.Service/GetTx",
                            [&](grpc::ClientContext* ctx) { return tx_->GetTx(ctx, req, &resp); }));
    return resp.tx_response();
  }

  absl::StatusOr<TxResponse> SignAndBroadcast(const common::PrivateKey& key,
                                              const std::vector<google::protobuf::Any>& msgs,
                                              bool wait) override {
    TS_ASSIGN_OR_RETURN(std::string chain_id, ChainId());
    const std::string address = common::AddressFromPublicKey(key.public_key());
    Signer& signer = SignerFor(address);
    absl::StatusOr<TxResponse> accepted =
        BroadcastWithSequence(key, chain_id, address, msgs, &signer);
    if (!accepted.ok() || accepted->code() != 0 || !wait) return accepted;
    return WaitForInclusion(accepted->txhash());
  }

 private:
  // The next sequence of one address, so txs can be sent back to back without waiting for a
  // block: the chain's CheckTx accepts queued sequences. `mu` also serialises signing for the
  // address, so two callers never sign the same sequence.
  struct Signer {
    absl::Mutex mu;
    bool known ABSL_GUARDED_BY(mu) = false;
    uint64_t account_number ABSL_GUARDED_BY(mu) = 0;
    uint64_t next_sequence ABSL_GUARDED_BY(mu) = 0;
  };

  template <typename Fn>
  absl::Status Call(std::string_view what, Fn&& fn) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(options_.call_timeout_ms));
    return FromGrpcStatus(fn(&ctx), what);
  }

  absl::StatusOr<std::string> ChainId() {
    {
      absl::MutexLock lock(&mu_);
      if (!chain_id_.empty()) return chain_id_;
    }
    TS_ASSIGN_OR_RETURN(ChainStatus status, Status());
    absl::MutexLock lock(&mu_);
    chain_id_ = status.chain_id;
    return chain_id_;
  }

  Signer& SignerFor(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Signer>& s = signers_[address];
    if (s == nullptr) s = std::make_unique<Signer>();
    return *s;
  }

  void Backoff(int attempt) {
    int64_t ms = std::min<int64_t>(options_.retry_backoff_ms * attempt, 5000);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }

  absl::StatusOr<TxResponse> BroadcastWithSequence(const common::PrivateKey& key,
                                                   const std::string& chain_id,
                                                   const std::string& address,
                                                   const std::vector<google::protobuf::Any>& msgs,
                                                   Signer* signer) {
    absl::MutexLock lock(&signer->mu);
    absl::Status last = absl::UnavailableError("no broadcast attempted");
    std::string tx_bytes;      // the signed tx of the current sequence, reused on retries
    bool sent_unsure = false;  // an earlier send of tx_bytes may have reached the chain
    uint64_t sequence = 0;
    const int attempts = std::max(1, options_.broadcast_attempts);
    for (int attempt = 0; attempt < attempts; ++attempt) {
      if (attempt > 0) Backoff(attempt);
      if (!signer->known) {
        absl::StatusOr<AccountInfo> acc = Account(address);
        if (!acc.ok()) {
          if (!Retryable(acc.status())) return acc.status();
          last = acc.status();
          continue;
        }
        signer->known = true;
        signer->account_number = acc->account_number;
        signer->next_sequence = acc->sequence;
      }
      if (tx_bytes.empty()) {
        sequence = signer->next_sequence;
        absl::StatusOr<std::string> paid =
            BuildPaidTx(*this, key, chain_id, signer->account_number, sequence, msgs);
        if (!paid.ok()) {
          if (!Retryable(paid.status())) return paid.status();
          last = paid.status();
          continue;
        }
        tx_bytes = *std::move(paid);
      }
      absl::StatusOr<TxResponse> resp = BroadcastRaw(tx_bytes);
      if (!resp.ok()) {
        if (!Retryable(resp.status())) return resp.status();
        // The tx may have reached the mempool: resend the same bytes, never a second tx.
        sent_unsure = true;
        last = resp.status();
        continue;
      }
      if (resp->code() == 0 || IsAlreadyQueued(*resp)) {
        signer->next_sequence = sequence + 1;
        resp->set_code(0);
        if (resp->txhash().empty()) resp->set_txhash(TxHash(tx_bytes));
        return resp;
      }
      if (IsSequenceMismatch(*resp)) {
        if (sent_unsure) {
          // A lost answer: the earlier send may already be in a block.
          absl::StatusOr<TxResponse> landed = GetTx(TxHash(tx_bytes));
          if (landed.ok()) {
            signer->known = false;
            return landed;
          }
        }
        signer->known = false;
        tx_bytes.clear();
        sent_unsure = false;
        last = absl::FailedPreconditionError(absl::StrCat("broadcast: sequence ", sequence, " of ",
                                                          address, " refused: ", resp->raw_log()));
        continue;
      }
      // Refused for another reason: the sequence was not consumed.
      return resp;
    }
    return last;
  }

  absl::StatusOr<TxResponse> WaitForInclusion(const std::string& txhash) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.inclusion_timeout_ms);
    const int64_t interval_ms =
        std::clamp<int64_t>(options_.retry_backoff_ms, 10, kPollIntervalMaxMs);
    absl::Status last;
    while (true) {
      absl::StatusOr<TxResponse> tx = GetTx(txhash);
      if (tx.ok()) return tx;
      if (!absl::IsNotFound(tx.status()) && !Retryable(tx.status())) return tx.status();
      last = tx.status();
      if (std::chrono::steady_clock::now() + std::chrono::milliseconds(interval_ms) > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("tx ", txhash, " not in a block after ",
                                                        options_.inclusion_timeout_ms,
                                                        " ms: ", last.ToString()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    }
  }

  const ChainClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<cosmos::tx::v1beta1::TxServiceStub> tx_;
  std::unique_ptr<cosmos::auth::v1beta1::Query::Stub> auth_;
  std::unique_ptr<cosmos::bank::v1beta1::Query::Stub> bank_;
  std::unique_ptr<pb::Query::Stub> module_;

  absl::Mutex mu_;
  std::string chain_id_ ABSL_GUARDED_BY(mu_);
  // One entry per local key that signed; keys are the operator's, not a peer's, so few.
  std::map<std::string, std::unique_ptr<Signer>> signers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<grpc::Channel> NewChainChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

std::unique_ptr<ChainClient> NewGrpcChainClient(const std::string& target,
                                                ChainClientOptions options) {
  return NewGrpcChainClient(NewChainChannel(target), options);
}

std::unique_ptr<ChainClient> NewGrpcChainClient(std::shared_ptr<grpc::Channel> channel,
                                                ChainClientOptions options) {
  return std::make_unique<GrpcChainClient>(std::move(channel), options);
}

}  // namespace ts::bridge
