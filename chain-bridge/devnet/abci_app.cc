#include "chain-bridge/devnet/abci_app.h"

#include <chrono>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>

#include "absl/strings/str_cat.h"
#include "chain-bridge/devnet/services.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/hex.h"
#include "common/status.h"
#include "proto/cosmos_tx_service.h"
#include "proto/grpc_status.h"

namespace ts::bridge::devnet {
namespace {

namespace abci = ::tendermint::abci;
using cosmos::base::abci::v1beta1::TxResponse;

// The SDK's TxResponse.data is the hex of ABCI's data bytes; a value that is not hex travels as
// it is rather than being lost.
std::string DataBytes(const std::string& data) {
  if (data.empty()) return data;
  absl::StatusOr<std::string> bytes = common::HexDecode(data);
  return bytes.ok() ? *std::move(bytes) : data;
}

// ResponseCheckTx and ExecTxResult carry the same fields under the same names.
template <typename Result>
void FillTxResult(TxResponse* from, Result* to) {
  to->set_code(from->code());
  to->set_data(DataBytes(from->data()));
  to->set_log(std::move(*from->mutable_raw_log()));
  to->set_info(std::move(*from->mutable_info()));
  to->set_gas_wanted(from->gas_wanted());
  to->set_gas_used(from->gas_used());
  to->mutable_events()->Swap(from->mutable_events());
  to->set_codespace(std::move(*from->mutable_codespace()));
}

// Pure, so they need not wait for the App's mutex.
abci::ResponsePrepareProposal PrepareProposal(const abci::RequestPrepareProposal& request) {
  abci::ResponsePrepareProposal response;
  int64_t total_bytes = 0;
  for (const std::string& tx : request.txs()) {
    // A prefix, not a selection: skipping one tx would fail the later txs of its signer, whose
    // sequences follow it.
    total_bytes += static_cast<int64_t>(tx.size());
    if (total_bytes > request.max_tx_bytes()) break;
    if (static_cast<size_t>(response.txs_size()) == kMaxTxsPerBlock) break;
    if (!DecodeTx(tx).ok()) continue;
    response.add_txs(tx);
  }
  return response;
}

abci::ResponseProcessProposal ProcessProposal(const abci::RequestProcessProposal& request) {
  bool accept = static_cast<size_t>(request.txs_size()) <= kMaxTxsPerBlock;
  for (int i = 0; accept && i < request.txs_size(); ++i) accept = DecodeTx(request.txs(i)).ok();
  abci::ResponseProcessProposal response;
  response.set_status(accept ? abci::ResponseProcessProposal::ACCEPT
                             : abci::ResponseProcessProposal::REJECT);
  return response;
}

void Refuse(const absl::Status& status, abci::ResponseQuery* response) {
  const TxCode code = TxCodeOf(status);
  response->set_code(code.code);
  response->set_codespace(code.codespace);
  response->set_log(std::string(status.message()));
}

}  // namespace

// The devnet's services reach the App through this, under the AbciApp's mutex. What needs the
// devnet's block store or mempool is CometBFT's business here and is refused.
class AbciApp::QueryBackend final : public Backend {
 public:
  explicit QueryBackend(AbciApp* owner) : owner_(owner) {}

  absl::StatusOr<TxResponse> Broadcast(std::string, cosmos::tx::v1beta1::BroadcastMode,
                                       std::chrono::system_clock::time_point) override {
    return absl::UnimplementedError(
        "broadcast: under CometBFT a tx enters through its mempool (broadcast_tx_sync)");
  }

  absl::StatusOr<TxResponse> Simulate(std::string_view tx_bytes) override {
    absl::MutexLock lock(&owner_->mu_);
    if (owner_->app_ == nullptr) return NoChain();
    return owner_->app_->Simulate(tx_bytes);
  }

  absl::StatusOr<std::shared_ptr<const pb::StoredBlock>> Block(int64_t height) override {
    return absl::NotFoundError(
        absl::StrCat("block ", height, ": blocks are stored by CometBFT, not by the application"));
  }

  absl::StatusOr<std::pair<std::shared_ptr<const pb::StoredBlock>, uint32_t>> FindTx(
      std::string_view) override {
    return absl::NotFoundError("txs are indexed by CometBFT, not by the application");
  }

  absl::Status WithApp(const std::function<void(const App&)>& fn) override {
    absl::MutexLock lock(&owner_->mu_);
    if (owner_->app_ == nullptr) return NoChain();
    fn(*owner_->app_);
    return absl::OkStatus();
  }

 private:
  static absl::Status NoChain() {
    return absl::UnavailableError("no chain yet: CometBFT has not called InitChain");
  }

  AbciApp* const owner_;
};

// A gRPC server with no port, reached through its in-process channel: Query calls the devnet's
// services by method path exactly as the JSON-RPC's abci_query calls them over the network.
struct AbciApp::QueryChannel {
  std::vector<std::unique_ptr<grpc::Service>> services;
  std::unique_ptr<grpc::Server> server;  // declared after the services: destroyed before them
  std::shared_ptr<grpc::Channel> channel;

  ~QueryChannel() {
    if (server != nullptr) server->Shutdown();
  }
};

AbciApp::AbciApp(pb::Genesis genesis, AbciAppOptions options)
    : genesis_(std::move(genesis)), options_(std::move(options)) {}

AbciApp::~AbciApp() = default;

absl::StatusOr<std::unique_ptr<AbciApp>> AbciApp::Create(pb::Genesis genesis,
                                                         AbciAppOptions options) {
  // The chain is created again at InitChain; a bad genesis is better found now than then.
  TS_RETURN_IF_ERROR(App::InitChain(genesis).status());
  std::unique_ptr<AbciApp> out(new AbciApp(std::move(genesis), std::move(options)));
  out->backend_ = std::make_unique<QueryBackend>(out.get());
  auto queries = std::make_unique<QueryChannel>();
  queries->services = MakeServices(out->backend_.get());
  grpc::ServerBuilder builder;
  // Queries take the App's mutex one at a time; a few pollers are plenty.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  for (auto& service : queries->services) builder.RegisterService(service.get());
  queries->server = builder.BuildAndStart();
  if (queries->server == nullptr) {
    return absl::InternalError("abci: cannot start the in-process query services");
  }
  queries->channel = queries->server->InProcessChannel(grpc::ChannelArguments());
  out->queries_ = std::move(queries);
  return out;
}

int64_t AbciApp::committed_height() const {
  absl::MutexLock lock(&mu_);
  return committed_height_;
}

absl::StatusOr<abci::Response> AbciApp::Handle(const abci::Request& request) {
  abci::Response response;
  switch (request.value_case()) {
    case abci::Request::kEcho:
      response.mutable_echo()->set_message(request.echo().message());
      break;
    case abci::Request::kFlush:
      response.mutable_flush();
      break;
    case abci::Request::kInfo:
      *response.mutable_info() = Info();
      break;
    case abci::Request::kInitChain: {
      TS_ASSIGN_OR_RETURN(*response.mutable_init_chain(), InitChain(request.init_chain()));
      break;
    }
    case abci::Request::kQuery:
      *response.mutable_query() = Query(request.query());
      break;
    case abci::Request::kCheckTx:
      *response.mutable_check_tx() = CheckTx(request.check_tx());
      break;
    case abci::Request::kCommit: {
      TS_ASSIGN_OR_RETURN(*response.mutable_commit(), Commit());
      break;
    }
    case abci::Request::kListSnapshots:
      response.mutable_list_snapshots();
      break;
    case abci::Request::kOfferSnapshot:
      // ABORT rather than REJECT: no snapshot can ever be restored, so trying others is futile.
      response.mutable_offer_snapshot()->set_result(abci::ResponseOfferSnapshot::ABORT);
      break;
    case abci::Request::kLoadSnapshotChunk:
      response.mutable_load_snapshot_chunk();
      break;
    case abci::Request::kApplySnapshotChunk:
      response.mutable_apply_snapshot_chunk()->set_result(abci::ResponseApplySnapshotChunk::ABORT);
      break;
    case abci::Request::kPrepareProposal:
      *response.mutable_prepare_proposal() = PrepareProposal(request.prepare_proposal());
      break;
    case abci::Request::kProcessProposal:
      *response.mutable_process_proposal() = ProcessProposal(request.process_proposal());
      break;
    case abci::Request::kExtendVote:
      response.mutable_extend_vote();
      break;
    case abci::Request::kVerifyVoteExtension:
      response.mutable_verify_vote_extension()->set_status(
          abci::ResponseVerifyVoteExtension::ACCEPT);
      break;
    case abci::Request::kFinalizeBlock: {
      TS_ASSIGN_OR_RETURN(*response.mutable_finalize_block(),
                          FinalizeBlock(request.finalize_block()));
      break;
    }
    case abci::Request::VALUE_NOT_SET:
      return absl::InvalidArgumentError(
          "request: no value (an empty request, or a method retired before ABCI 2.0)");
  }
  return response;
}

abci::ResponseInfo AbciApp::Info() {
  abci::ResponseInfo info;
  info.set_data("trainshard");
  info.set_version(options_.version);
  info.set_app_version(options_.app_version);
  absl::MutexLock lock(&mu_);
  info.set_last_block_height(committed_height_);
  info.set_last_block_app_hash(committed_app_hash_);
  return info;
}

absl::StatusOr<abci::ResponseInitChain> AbciApp::InitChain(const abci::RequestInitChain& request) {
  // The genesis given to the server is the state's only source: app_state_bytes (CometBFT's
  // genesis.json app_state) is not read.
  if (request.chain_id() != genesis_.chain_id()) {
    return absl::InvalidArgumentError(absl::StrCat("InitChain: chain_id '", request.chain_id(),
                                                   "' is not the genesis's '", genesis_.chain_id(),
                                                   "'"));
  }
  if (request.initial_height() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("InitChain: initial_height ",
                                                   request.initial_height(),
                                                   ": the module starts its chains at height 1"));
  }
  absl::MutexLock lock(&mu_);
  if (app_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("InitChain: the chain exists already (at height ", app_->height(), ")"));
  }
  TS_ASSIGN_OR_RETURN(app_, App::InitChain(genesis_));
  committed_height_ = app_->height();
  committed_app_hash_ = app_->app_hash();
  abci::ResponseInitChain response;
  response.set_app_hash(app_->app_hash());
  return response;
}

abci::ResponseCheckTx AbciApp::CheckTx(const abci::RequestCheckTx& request) {
  TxResponse checked;
  {
    absl::MutexLock lock(&mu_);
    if (app_ == nullptr) {
      abci::ResponseCheckTx refused;
      const absl::Status status = absl::FailedPreconditionError("no chain yet: InitChain first");
      const TxCode code = TxCodeOf(status);
      refused.set_code(code.code);
      refused.set_codespace(code.codespace);
      refused.set_log(std::string(status.message()));
      return refused;
    }
    checked = app_->CheckTx(request.tx());
  }
  abci::ResponseCheckTx response;
  FillTxResult(&checked, &response);
  return response;
}

abci::ResponseQuery AbciApp::Query(const abci::RequestQuery& request) {
  abci::ResponseQuery response;
  int64_t latest = 0;
  {
    absl::MutexLock lock(&mu_);
    if (app_ != nullptr) latest = app_->height();
  }
  response.set_height(latest);
  const std::string& path = request.path();
  if (path.empty() || path[0] != '/' || path.size() > kMaxQueryPathBytes) {
    Refuse(SdkError(SdkCode::kUnknownRequest, absl::StrCat("path: \"", path.substr(0, 64),
                                                           "\" is not a gRPC method path such as "
                                                           "/cosmos.bank.v1beta1.Query/Balance")),
           &response);
    return response;
  }
  if (path == cosmos::tx::v1beta1::kBroadcastTxPath) {
    Refuse(SdkError(SdkCode::kUnknownRequest,
                    "path: a tx enters through CometBFT's mempool, not through Query"),
           &response);
    return response;
  }
  if (request.height() != 0 && request.height() != latest) {
    Refuse(SdkError(SdkCode::kInvalidRequest,
                    absl::StrCat("height: ", request.height(), ": only the latest height (", latest,
                                 ") is served; the application keeps no history")),
           &response);
    return response;
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(options_.query_timeout_ms));
  grpc::internal::RpcMethod method(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC,
                                   queries_->channel);
  grpc::Slice slice(request.data());
  grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      queries_->channel.get(), method, &context, in, &out);
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    Refuse(SdkError(SdkCode::kUnknownRequest, absl::StrCat("path: unknown query path ", path)),
           &response);
    return response;
  }
  if (!status.ok()) {
    // A Simulate refusal carries the tx's own code in its message; other errors report as the
    // module's codespace with their canonical code.
    std::string log;
    TxCode code;
    if (!ParseRefusalMessage(status.error_message(), &log, &code)) {
      code = TxCodeOf(FromGrpcStatus(status));
      log = status.error_message();
    }
    response.set_code(code.code);
    response.set_codespace(code.codespace);
    response.set_log(log);
    return response;
  }
  std::vector<grpc::Slice> slices;
  std::string value;
  if (out.Dump(&slices).ok()) {
    for (const auto& s : slices) value.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  response.set_value(std::move(value));
  return response;
}

absl::StatusOr<abci::ResponseFinalizeBlock> AbciApp::FinalizeBlock(
    const abci::RequestFinalizeBlock& request) {
  absl::MutexLock lock(&mu_);
  if (app_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("FinalizeBlock at height ", request.height(), " before InitChain"));
  }
  if (finalized_ && request.height() == app_->height() && request.hash() == finalized_hash_) {
    return finalized_response_;
  }
  if (finalized_) {
    return absl::FailedPreconditionError(absl::StrCat("FinalizeBlock at height ", request.height(),
                                                      ": block ", app_->height(),
                                                      " was finalized and is not committed yet"));
  }
  if (request.height() != app_->height() + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("FinalizeBlock: height ", request.height(),
                     " is not the next height: the application is at height ", app_->height(),
                     " and expects ", app_->height() + 1));
  }
  tendermint::types::Header header;
  header.set_chain_id(genesis_.chain_id());
  header.set_height(request.height());
  *header.mutable_time() = request.time();
  header.set_proposer_address(request.proposer_address());
  header.set_app_hash(app_->app_hash());  // as CometBFT: the hash after the previous block
  const std::vector<std::string> txs(request.txs().begin(), request.txs().end());
  TS_ASSIGN_OR_RETURN(BlockOutcome outcome, app_->FinalizeBlock(header, txs));
  finalized_ = true;
  abci::ResponseFinalizeBlock response;
  for (TxResponse& result : *outcome.results.mutable_tx_results()) {
    FillTxResult(&result, response.add_tx_results());
  }
  response.mutable_events()->Swap(outcome.results.mutable_end_block_events());
  response.set_app_hash(outcome.results.app_hash());
  finalized_hash_ = request.hash();
  finalized_response_ = response;
  return response;
}

absl::StatusOr<abci::ResponseCommit> AbciApp::Commit() {
  absl::MutexLock lock(&mu_);
  if (app_ == nullptr) return absl::FailedPreconditionError("Commit before InitChain");
  if (!finalized_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Commit: no block was finalized since the commit of height ", committed_height_));
  }
  app_->Commit();
  finalized_ = false;
  finalized_hash_.clear();
  finalized_response_.Clear();
  committed_height_ = app_->height();
  committed_app_hash_ = app_->app_hash();
  abci::ResponseCommit response;
  response.set_retain_height(0);
  return response;
}

}  // namespace ts::bridge::devnet
