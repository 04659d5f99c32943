#include "chain-bridge/devnet/services.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "chain-bridge/devnet/rpc_json.h"
#include "chain-bridge/devnet/store.h"
#include "chain-bridge/module/gas.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/status.h"
#include "cosmos/auth/v1beta1/auth.pb.h"
#include "cosmos/auth/v1beta1/query.grpc.pb.h"
#include "cosmos/bank/v1beta1/query.grpc.pb.h"
#include "cosmos/crypto/secp256k1/keys.pb.h"
#include "gonka/trainshard/v1/chain.grpc.pb.h"
#include "inference/inference/trainshard.grpc.pb.h"
#include "proto/cosmos_node_service.h"
#include "proto/cosmos_tendermint_service.h"
#include "proto/cosmos_tx_service.h"
#include "proto/grpc_status.h"

namespace ts::bridge::devnet {
namespace {

using cosmos::base::abci::v1beta1::TxResponse;

// Runs a handler body, turning its absl::Status into the RPC's status and any exception that
// escapes library code into INTERNAL, so a bug in one call never takes the node down.
template <typename Fn>
grpc::Status Serve(std::string_view method, Fn&& fn) {
  try {
    return ToGrpcStatus(fn());
  } catch (const std::exception& e) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        absl::StrCat(absl::string_view(method.data(), method.size()), ": ", e.what()));
  }
}

absl::Status CheckAddress(std::string_view field, const std::string& address) {
  return common::ParseAddress(field, address).status();
}

absl::Status CheckHeight(int64_t height) {
  if (height <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("height: ", height, " must be positive"));
  }
  return absl::OkStatus();
}

std::string Rfc3339(const google::protobuf::Timestamp& t) {
  absl::Time time = absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone());
}

// The decoded form of a stored TxRaw, or nullopt-like false if it does not decode (a block may
// hold a tx that failed at delivery; its raw bytes still are in the block).
bool DecodeToTx(std::string_view tx_bytes, cosmos::tx::v1beta1::Tx* tx) {
  absl::StatusOr<DecodedTx> decoded = DecodeTx(tx_bytes);
  if (!decoded.ok()) return false;
  *tx->mutable_body() = decoded->body;
  *tx->mutable_auth_info() = decoded->auth_info;
  for (const std::string& sig : decoded->raw.signatures()) tx->add_signatures(sig);
  return true;
}

// ---------------------------------------------------------------------------------------------
// cosmos.tx.v1beta1.Service

class TxService final : public cosmos::tx::v1beta1::TxServiceBase {
 public:
  explicit TxService(Backend* backend) : backend_(backend) {}

  // A tx that would fail is INVALID_ARGUMENT whose message is its raw log followed by
  // "(codespace C, code N)", as a Cosmos node answers Simulate with an error.
  grpc::Status Simulate(grpc::ServerContext*, const cosmos::tx::v1beta1::SimulateRequest* request,
                        cosmos::tx::v1beta1::SimulateResponse* response) override {
    return Serve("Simulate", [&]() -> absl::Status {
      std::string tx_bytes = request->tx_bytes();
      if (tx_bytes.empty() && request->has_tx()) {
        // The deprecated field: a Tx is a TxRaw with its parts as messages.
        cosmos::tx::v1beta1::TxRaw raw;
        raw.set_body_bytes(request->tx().body().SerializeAsString());
        raw.set_auth_info_bytes(request->tx().auth_info().SerializeAsString());
        for (const auto& signature : request->tx().signatures()) raw.add_signatures(signature);
        tx_bytes = raw.SerializeAsString();
      }
      if (tx_bytes.empty()) return absl::InvalidArgumentError("tx_bytes: empty");
      TS_ASSIGN_OR_RETURN(cosmos::base::abci::v1beta1::TxResponse simulated,
                          backend_->Simulate(tx_bytes));
      if (simulated.code() != 0) {
        return absl::InvalidArgumentError(
            RefusalMessage(simulated.raw_log(), TxCode{simulated.codespace(), simulated.code()}));
      }
      response->mutable_gas_info()->set_gas_wanted(static_cast<uint64_t>(simulated.gas_wanted()));
      response->mutable_gas_info()->set_gas_used(static_cast<uint64_t>(simulated.gas_used()));
      for (auto& event : *simulated.mutable_events()) {
        *response->mutable_result()->add_events() = std::move(event);
      }
      return absl::OkStatus();
    });
  }

  grpc::Status BroadcastTx(grpc::ServerContext* context,
                           const cosmos::tx::v1beta1::BroadcastTxRequest* request,
                           cosmos::tx::v1beta1::BroadcastTxResponse* response) override {
    return Serve("BroadcastTx", [&]() -> absl::Status {
      if (request->tx_bytes().empty()) return absl::InvalidArgumentError("tx_bytes: empty");
      if (request->mode() == cosmos::tx::v1beta1::BROADCAST_MODE_UNSPECIFIED ||
          !cosmos::tx::v1beta1::BroadcastMode_IsValid(request->mode())) {
        return absl::InvalidArgumentError(absl::StrCat("mode: ", static_cast<int>(request->mode()),
                                                       " is not SYNC, ASYNC or BLOCK"));
      }
      TS_ASSIGN_OR_RETURN(
          *response->mutable_tx_response(),
          backend_->Broadcast(request->tx_bytes(), request->mode(), context->deadline()));
      return absl::OkStatus();
    });
  }

  grpc::Status GetTx(grpc::ServerContext*, const cosmos::tx::v1beta1::GetTxRequest* request,
                     cosmos::tx::v1beta1::GetTxResponse* response) override {
    return Serve("GetTx", [&]() -> absl::Status {
      absl::StatusOr<std::string> hash = common::HexDecode(request->hash());
      if (!hash.ok() || hash->size() != common::kSha256Size) {
        return absl::InvalidArgumentError(
            absl::StrCat("hash: \"", request->hash().substr(0, 80), "\" is not 64 hex digits"));
      }
      TS_ASSIGN_OR_RETURN(auto found, backend_->FindTx(*hash));
      const auto& [block, index] = found;
      *response->mutable_tx_response() = DeliveredTxResponse(*block, index);
      DecodeToTx(block->block().data().txs(static_cast<int>(index)), response->mutable_tx());
      return absl::OkStatus();
    });
  }

  grpc::Status GetBlockWithTxs(grpc::ServerContext*,
                               const cosmos::tx::v1beta1::GetBlockWithTxsRequest* request,
                               cosmos::tx::v1beta1::GetBlockWithTxsResponse* response) override {
    return Serve("GetBlockWithTxs", [&]() -> absl::Status {
      TS_RETURN_IF_ERROR(CheckHeight(request->height()));
      TS_ASSIGN_OR_RETURN(std::shared_ptr<const pb::StoredBlock> block,
                          backend_->Block(request->height()));
      *response->mutable_block() = block->block();
      response->mutable_block_id()->set_hash(HeaderHash(block->block().header()));
      const auto& txs = block->block().data().txs();
      const uint64_t total = static_cast<uint64_t>(txs.size());
      const uint64_t offset = std::min(request->pagination().offset(), total);
      uint64_t limit = request->pagination().limit();
      if (limit == 0 || limit > kBlockTxsPageMax) limit = kBlockTxsPageMax;
      for (uint64_t i = offset; i < total && i < offset + limit; ++i) {
        DecodeToTx(txs[static_cast<int>(i)], response->add_txs());
      }
      if (request->pagination().count_total()) response->mutable_pagination()->set_total(total);
      if (offset + limit < total) {
        // Cosmos pages by key; here the key is the next offset, big-endian.
        response->mutable_pagination()->set_next_key(state::EncodeU64Key(offset + limit));
      }
      return absl::OkStatus();
    });
  }

 private:
  Backend* backend_;
};

// ---------------------------------------------------------------------------------------------
// cosmos.auth.v1beta1.Query and cosmos.bank.v1beta1.Query

class AuthQuery final : public cosmos::auth::v1beta1::Query::Service {
 public:
  explicit AuthQuery(Backend* backend) : backend_(backend) {}

  grpc::Status Account(grpc::ServerContext*, const cosmos::auth::v1beta1::QueryAccountRequest* req,
                       cosmos::auth::v1beta1::QueryAccountResponse* resp) override {
    return Serve("Account", [&]() -> absl::Status {
      TS_RETURN_IF_ERROR(CheckAddress("address", req->address()));
      absl::Status result;
      TS_RETURN_IF_ERROR(backend_->WithApp([&](const App& app) {
        absl::StatusOr<std::pair<uint64_t, uint64_t>> acc = app.Account(req->address());
        if (!acc.ok()) {
          result = acc.status();
          return;
        }
        cosmos::auth::v1beta1::BaseAccount base;
        base.set_address(req->address());
        base.set_account_number(acc->first);
        base.set_sequence(acc->second);
        std::string pubkey = app.AccountPublicKey(req->address());
        if (!pubkey.empty()) {
          cosmos::crypto::secp256k1::PubKey pk;
          pk.set_key(pubkey);
          base.mutable_pub_key()->set_type_url(std::string(kSecp256k1PubKeyType));
          base.mutable_pub_key()->set_value(pk.SerializeAsString());
        }
        resp->mutable_account()->set_type_url("/cosmos.auth.v1beta1.BaseAccount");
        resp->mutable_account()->set_value(base.SerializeAsString());
      }));
      return result;
    });
  }

 private:
  Backend* backend_;
};

class BankQuery final : public cosmos::bank::v1beta1::Query::Service {
 public:
  explicit BankQuery(Backend* backend) : backend_(backend) {}

  grpc::Status Balance(grpc::ServerContext*, const cosmos::bank::v1beta1::QueryBalanceRequest* req,
                       cosmos::bank::v1beta1::QueryBalanceResponse* resp) override {
    return Serve("Balance", [&]() -> absl::Status {
      TS_RETURN_IF_ERROR(CheckAddress("address", req->address()));
      if (req->denom().empty()) return absl::InvalidArgumentError("denom: empty");
      uint64_t amount = 0;
      // The chain holds one denom; any other balance is zero, as Cosmos answers.
      if (req->denom() == common::kDenom) {
        TS_RETURN_IF_ERROR(
            backend_->WithApp([&](const App& app) { amount = app.Balance(req->address()); }));
      }
      resp->mutable_balance()->set_denom(req->denom());
      resp->mutable_balance()->set_amount(common::FormatAmount(amount));
      return absl::OkStatus();
    });
  }

  // The chain holds one denom: an account's balances are its ngonka, or none when it holds 0
  // (as Cosmos lists only non-zero coins); one page, whatever the pagination asks.
  grpc::Status AllBalances(grpc::ServerContext*,
                           const cosmos::bank::v1beta1::QueryAllBalancesRequest* req,
                           cosmos::bank::v1beta1::QueryAllBalancesResponse* resp) override {
    return Serve("AllBalances", [&]() -> absl::Status {
      TS_RETURN_IF_ERROR(CheckAddress("address", req->address()));
      uint64_t amount = 0;
      TS_RETURN_IF_ERROR(
          backend_->WithApp([&](const App& app) { amount = app.Balance(req->address()); }));
      if (amount > 0) {
        auto* coin = resp->add_balances();
        coin->set_denom(std::string(common::kDenom));
        coin->set_amount(common::FormatAmount(amount));
      }
      if (req->pagination().count_total()) {
        resp->mutable_pagination()->set_total(static_cast<uint64_t>(resp->balances_size()));
      }
      return absl::OkStatus();
    });
  }

  grpc::Status SupplyOf(grpc::ServerContext*,
                        const cosmos::bank::v1beta1::QuerySupplyOfRequest* req,
                        cosmos::bank::v1beta1::QuerySupplyOfResponse* resp) override {
    return Serve("SupplyOf", [&]() -> absl::Status {
      if (req->denom().empty()) return absl::InvalidArgumentError("denom: empty");
      uint64_t amount = 0;
      if (req->denom() == common::kDenom) {
        TS_RETURN_IF_ERROR(backend_->WithApp([&](const App& app) { amount = app.TotalSupply(); }));
      }
      resp->mutable_amount()->set_denom(req->denom());
      resp->mutable_amount()->set_amount(common::FormatAmount(amount));
      return absl::OkStatus();
    });
  }

 private:
  Backend* backend_;
};

// ---------------------------------------------------------------------------------------------
// gonka.trainshard.v1.Query

class ModuleQuery final : public pb::Query::Service {
 public:
  explicit ModuleQuery(Backend* backend) : backend_(backend) {}

  grpc::Status Shard(grpc::ServerContext*, const pb::QueryShardRequest* req,
                     pb::QueryShardResponse* resp) override {
    return Serve("Shard", [&] {
      return WithApp([&](const App& app) -> absl::Status {
        TS_ASSIGN_OR_RETURN(*resp->mutable_shard(), app.GetShard(req->shard_id()));
        return absl::OkStatus();
      });
    });
  }

  grpc::Status Shards(grpc::ServerContext*, const pb::QueryShardsRequest* req,
                      pb::QueryShardsResponse* resp) override {
    return Serve("Shards", [&] {
      if (!pb::ShardStatus_IsValid(req->status())) {
        return absl::InvalidArgumentError(
            absl::StrCat("status: ", static_cast<int>(req->status()), " is not a shard status"));
      }
      uint32_t limit = req->limit();
      if (limit == 0 || limit > kShardsPageMax) limit = kShardsPageMax;
      return WithApp([&](const App& app) -> absl::Status {
        for (pb::Shard& s : app.ListShards(req->status(), req->start_after_id(), limit)) {
          if (static_cast<uint32_t>(resp->shards_size()) >= limit) break;
          *resp->add_shards() = std::move(s);
        }
        return absl::OkStatus();
      });
    });
  }

  grpc::Status Escrow(grpc::ServerContext*, const pb::QueryEscrowRequest* req,
                      pb::QueryEscrowResponse* resp) override {
    return Serve("Escrow", [&] {
      return WithApp([&](const App& app) -> absl::Status {
        TS_ASSIGN_OR_RETURN(pb::Shard shard, app.GetShard(req->shard_id()));
        resp->set_shard_escrow(shard.escrow_held());
        resp->set_escrow_address(app.EscrowAddress());
        resp->set_module_balance(common::FormatAmount(app.Balance(app.EscrowAddress())));
        return absl::OkStatus();
      });
    });
  }

  grpc::Status Reservations(grpc::ServerContext*, const pb::QueryReservationsRequest* req,
                            pb::QueryReservationsResponse* resp) override {
    return Serve("Reservations", [&] {
      return WithApp([&](const App& app) -> absl::Status {
        TS_ASSIGN_OR_RETURN(pb::Shard shard, app.GetShard(req->shard_id()));
        *resp->mutable_reservations() = shard.reservations();
        resp->set_total_weight(shard.total_weight());
        return absl::OkStatus();
      });
    });
  }

  grpc::Status Settlement(grpc::ServerContext*, const pb::QuerySettlementRequest* req,
                          pb::QuerySettlementResponse* resp) override {
    return Serve("Settlement", [&] {
      return WithApp([&](const App& app) -> absl::Status {
        TS_ASSIGN_OR_RETURN(*resp->mutable_record(), app.GetSettlement(req->shard_id()));
        return absl::OkStatus();
      });
    });
  }

  grpc::Status Weights(grpc::ServerContext*, const pb::QueryWeightsRequest* req,
                       pb::QueryWeightsResponse* resp) override {
    return Serve("Weights", [&] {
      return WithApp([&](const App& app) -> absl::Status {
        uint64_t epoch = req->current() ? app.CurrentEpoch() : req->epoch();
        TS_ASSIGN_OR_RETURN(*resp->mutable_weights(), app.GetWeights(epoch));
        return absl::OkStatus();
      });
    });
  }

  grpc::Status Proposal(grpc::ServerContext*, const pb::QueryProposalRequest* req,
                        pb::QueryProposalResponse* resp) override {
    return Serve("Proposal", [&] {
      return WithApp([&](const App& app) -> absl::Status {
        TS_ASSIGN_OR_RETURN(*resp->mutable_proposal(), app.GetProposal(req->proposal_id()));
        return absl::OkStatus();
      });
    });
  }

  grpc::Status Params(grpc::ServerContext*, const pb::QueryParamsRequest*,
                      pb::QueryParamsResponse* resp) override {
    return Serve("Params", [&] {
      return WithApp([&](const App& app) -> absl::Status {
        *resp->mutable_params() = app.genesis().params();
        resp->set_chain_id(app.chain_id());
        resp->set_gov_address(app.GovAddress());
        resp->set_escrow_address(app.EscrowAddress());
        resp->set_fee_collector_address(app.FeeCollectorAddress());
        return absl::OkStatus();
      });
    });
  }

  grpc::Status Status(grpc::ServerContext*, const pb::QueryStatusRequest*,
                      pb::QueryStatusResponse* resp) override {
    return Serve("Status", [&] {
      return WithApp([&](const App& app) -> absl::Status {
        resp->set_chain_id(app.chain_id());
        resp->set_latest_height(app.height());
        resp->set_app_hash(app.app_hash());
        resp->set_epoch(app.CurrentEpoch());
        resp->set_total_supply(common::FormatAmount(app.TotalSupply()));
        return absl::OkStatus();
      });
    });
  }

  grpc::Status BlockEvents(grpc::ServerContext*, const pb::QueryBlockEventsRequest* req,
                           pb::QueryBlockEventsResponse* resp) override {
    return Serve("BlockEvents", [&]() -> absl::Status {
      TS_RETURN_IF_ERROR(CheckHeight(req->height()));
      TS_ASSIGN_OR_RETURN(std::shared_ptr<const pb::StoredBlock> block,
                          backend_->Block(req->height()));
      resp->set_height(req->height());
      for (const TxResponse& tx : block->results().tx_results()) {
        for (const tendermint::abci::Event& e : tx.events()) *resp->add_events() = e;
      }
      for (const tendermint::abci::Event& e : block->results().end_block_events()) {
        *resp->add_events() = e;
      }
      resp->set_app_hash(block->results().app_hash());
      return absl::OkStatus();
    });
  }

 private:
  absl::Status WithApp(const std::function<absl::Status(const App&)>& fn) {
    absl::Status result;
    TS_RETURN_IF_ERROR(backend_->WithApp([&](const App& app) { result = fn(app); }));
    return result;
  }

  Backend* backend_;
};

// ---------------------------------------------------------------------------------------------
// inference.inference.Query: Gonka's trainshards v0 queries, served in the gonka-v0 profile
// (FAILED_PRECONDITION on a chain of the module).

namespace gv0 = ::inference::inference;

class GonkaQuery final : public gv0::Query::Service {
 public:
  explicit GonkaQuery(Backend* backend) : backend_(backend) {}

  grpc::Status Trainshard(grpc::ServerContext*, const gv0::QueryGetTrainshardRequest* req,
                          gv0::QueryGetTrainshardResponse* resp) override {
    return Serve("Trainshard", [&] {
      return Answer([&](const App& app) { return app.GonkaTrainshard(req->trainshard_id()); },
                    resp);
    });
  }

  grpc::Status ActiveTrainshards(grpc::ServerContext*, const gv0::QueryActiveTrainshardsRequest*,
                                 gv0::QueryActiveTrainshardsResponse* resp) override {
    return Serve("ActiveTrainshards", [&] {
      return Answer([&](const App& app) { return app.GonkaActiveTrainshards(); }, resp);
    });
  }

  grpc::Status TrainshardProposal(grpc::ServerContext*,
                                  const gv0::QueryGetTrainshardProposalRequest* req,
                                  gv0::QueryGetTrainshardProposalResponse* resp) override {
    return Serve("TrainshardProposal", [&] {
      return Answer([&](const App& app) { return app.GonkaProposal(req->proposal_id()); }, resp);
    });
  }

 private:
  // Runs one of the App's Gonka queries and moves its answer into `resp`.
  template <typename Query, typename Response>
  absl::Status Answer(Query query, Response* resp) {
    absl::Status result;
    TS_RETURN_IF_ERROR(backend_->WithApp([&](const App& app) {
      auto answer = query(app);
      if (answer.ok()) {
        *resp = *std::move(answer);
      } else {
        result = answer.status();
      }
    }));
    return result;
  }

  Backend* backend_;
};

}  // namespace

TxResponse DeliveredTxResponse(const pb::StoredBlock& block, uint32_t index) {
  TS_CHECK(index < static_cast<uint32_t>(block.block().data().txs_size()));
  const std::string& tx_bytes = block.block().data().txs(static_cast<int>(index));
  TxResponse resp;
  if (index < static_cast<uint32_t>(block.results().tx_results_size())) {
    resp = block.results().tx_results(static_cast<int>(index));
  }
  resp.set_height(block.block().header().height());
  resp.set_txhash(TxHash(tx_bytes));
  resp.set_timestamp(Rfc3339(block.block().header().time()));
  cosmos::tx::v1beta1::Tx tx;
  if (DecodeToTx(tx_bytes, &tx)) {
    resp.mutable_tx()->set_type_url("/cosmos.tx.v1beta1.Tx");
    resp.mutable_tx()->set_value(tx.SerializeAsString());
  }
  return resp;
}

// ---------------------------------------------------------------------------------------------
// cosmos.base.tendermint.v1beta1.Service

namespace {

namespace tm = cosmos::base::tendermint::v1beta1;

class TendermintService final : public tm::TendermintServiceBase {
 public:
  explicit TendermintService(Backend* backend) : backend_(backend) {}

  grpc::Status GetNodeInfo(grpc::ServerContext*, const tm::GetNodeInfoRequest*,
                           tm::GetNodeInfoResponse* response) override {
    return Serve("GetNodeInfo", [&]() -> absl::Status {
      TS_ASSIGN_OR_RETURN(std::string chain_id, ChainId());
      // The node info of the status JSON-RPC call, in its protobuf form.
      auto* info = response->mutable_default_node_info();
      info->mutable_protocol_version()->set_p2p(rpc_json::kCometP2pVersion);
      info->mutable_protocol_version()->set_block(rpc_json::kCometBlockVersion);
      info->set_default_node_id(rpc_json::NodeId(chain_id));
      info->set_network(chain_id);
      info->set_version(rpc_json::kCometVersion);
      info->set_moniker(rpc_json::kMoniker);
      info->mutable_other()->set_tx_index("on");
      auto* version = response->mutable_application_version();
      version->set_name("trainshard");
      version->set_app_name("trainshard-devnet");
      version->set_version(rpc_json::kAppVersion);
      return absl::OkStatus();
    });
  }

  grpc::Status GetSyncing(grpc::ServerContext*, const tm::GetSyncingRequest*,
                          tm::GetSyncingResponse* response) override {
    // The devnet produces every block itself: it is never behind.
    response->set_syncing(false);
    return grpc::Status::OK;
  }

  grpc::Status GetLatestBlock(grpc::ServerContext*, const tm::GetLatestBlockRequest*,
                              tm::GetLatestBlockResponse* response) override {
    return Serve("GetLatestBlock", [&]() -> absl::Status {
      TS_ASSIGN_OR_RETURN(int64_t latest, LatestHeight());
      if (latest == 0) return absl::NotFoundError("no block yet: the chain is at height 0");
      return FillBlock(latest, response);
    });
  }

  grpc::Status GetBlockByHeight(grpc::ServerContext*, const tm::GetBlockByHeightRequest* request,
                                tm::GetBlockByHeightResponse* response) override {
    return Serve("GetBlockByHeight", [&]() -> absl::Status {
      TS_RETURN_IF_ERROR(CheckStoredHeight(request->height()));
      return FillBlock(request->height(), response);
    });
  }

  grpc::Status GetLatestValidatorSet(grpc::ServerContext*, const tm::GetLatestValidatorSetRequest*,
                                     tm::GetLatestValidatorSetResponse* response) override {
    return Serve("GetLatestValidatorSet", [&]() -> absl::Status {
      TS_ASSIGN_OR_RETURN(int64_t latest, LatestHeight());
      return FillValidators(latest, response);
    });
  }

  grpc::Status GetValidatorSetByHeight(grpc::ServerContext*,
                                       const tm::GetValidatorSetByHeightRequest* request,
                                       tm::GetValidatorSetByHeightResponse* response) override {
    return Serve("GetValidatorSetByHeight", [&]() -> absl::Status {
      TS_RETURN_IF_ERROR(CheckStoredHeight(request->height()));
      return FillValidators(request->height(), response);
    });
  }

 private:
  // A positive height the chain has reached; above it, the SDK's words for a height past the
  // chain's.
  absl::Status CheckStoredHeight(int64_t height) {
    TS_RETURN_IF_ERROR(CheckHeight(height));
    TS_ASSIGN_OR_RETURN(int64_t latest, LatestHeight());
    if (height > latest) {
      return absl::InvalidArgumentError(absl::StrCat("requested block height ", height,
                                                     " is bigger then the chain length ", latest));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ChainId() {
    std::string chain_id;
    TS_RETURN_IF_ERROR(backend_->WithApp([&](const App& app) { chain_id = app.chain_id(); }));
    return chain_id;
  }

  absl::StatusOr<int64_t> LatestHeight() {
    int64_t height = 0;
    TS_RETURN_IF_ERROR(backend_->WithApp([&](const App& app) { height = app.height(); }));
    return height;
  }

  // block_id, block and sdk_block of the stored block at `height`.
  template <typename Response>
  absl::Status FillBlock(int64_t height, Response* response) {
    TS_ASSIGN_OR_RETURN(std::shared_ptr<const pb::StoredBlock> stored, backend_->Block(height));
    const tendermint::types::Header& header = stored->block().header();
    const rpc_json::Validator validator = rpc_json::DevnetValidator(header.chain_id());
    response->mutable_block_id()->set_hash(HeaderHash(header));
    *response->mutable_block() = stored->block();
    response->mutable_block()->mutable_header()->set_proposer_address(validator.address);
    tm::Header* sdk = response->mutable_sdk_block()->mutable_header();
    sdk->set_chain_id(header.chain_id());
    sdk->set_height(header.height());
    *sdk->mutable_time() = header.time();
    *sdk->mutable_last_block_id() = header.last_block_id();
    sdk->set_data_hash(header.data_hash());
    sdk->set_app_hash(header.app_hash());
    sdk->set_proposer_address(common::AddressFromBytes(validator.address, kValConsPrefix));
    *response->mutable_sdk_block()->mutable_data() = stored->block().data();
    return absl::OkStatus();
  }

  // The devnet's one validator (as the validators JSON-RPC call shows it), at `height`.
  template <typename Response>
  absl::Status FillValidators(int64_t height, Response* response) {
    TS_ASSIGN_OR_RETURN(std::string chain_id, ChainId());
    const rpc_json::Validator validator = rpc_json::DevnetValidator(chain_id);
    response->set_block_height(height);
    tm::Validator* one = response->add_validators();
    one->set_address(common::AddressFromBytes(validator.address, kValConsPrefix));
    one->mutable_pub_key()->set_type_url("/cosmos.crypto.ed25519.PubKey");
    // cosmos.crypto.ed25519.PubKey{bytes key = 1}: tag 0x0a, length 32, the key.
    one->mutable_pub_key()->set_value(std::string("\x0a\x20", 2) + validator.public_key);
    one->set_voting_power(1);
    response->mutable_pagination()->set_total(1);
    return absl::OkStatus();
  }

  // The bech32 prefix of consensus (validator) addresses.
  static constexpr char kValConsPrefix[] = "gonkavalcons";

  Backend* backend_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// cosmos.base.node.v1beta1.Service

namespace {

namespace node = cosmos::base::node::v1beta1;

// What Cosmos clients ask a node for before they price a tx: its minimum gas price, here the
// genesis's (one price, in ngonka), printed as the SDK prints DecCoins.
class NodeService final : public node::NodeServiceBase {
 public:
  explicit NodeService(Backend* backend) : backend_(backend) {}

  grpc::Status Config(grpc::ServerContext*, const node::ConfigRequest*,
                      node::ConfigResponse* response) override {
    return Serve("Config", [&] {
      return backend_->WithApp([&](const App& app) {
        response->set_minimum_gas_price(
            MinimumGasPriceText(app.genesis().params().min_gas_price()));
      });
    });
  }

 private:
  Backend* backend_;
};

}  // namespace

std::string MinimumGasPriceText(std::string_view min_gas_price) {
  auto price = ParseGasPrice("min_gas_price", min_gas_price);
  if (!price.ok() || price->zero()) return "";
  // 18 fraction digits, as the SDK's LegacyDec prints.
  size_t dot = min_gas_price.find('.');
  std::string integer(min_gas_price.substr(0, dot));
  std::string fraction(dot == std::string_view::npos ? "" : min_gas_price.substr(dot + 1));
  fraction.resize(18, '0');
  return integer + "." + fraction + std::string(common::kDenom);
}

std::vector<std::unique_ptr<grpc::Service>> MakeServices(Backend* backend) {
  std::vector<std::unique_ptr<grpc::Service>> out;
  out.push_back(std::make_unique<TxService>(backend));
  out.push_back(std::make_unique<AuthQuery>(backend));
  out.push_back(std::make_unique<BankQuery>(backend));
  out.push_back(std::make_unique<ModuleQuery>(backend));
  out.push_back(std::make_unique<TendermintService>(backend));
  out.push_back(std::make_unique<NodeService>(backend));
  out.push_back(std::make_unique<GonkaQuery>(backend));
  return out;
}

}  // namespace ts::bridge::devnet
