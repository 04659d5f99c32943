#include "chain-bridge/devnet/rpc_json.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "chain-bridge/devnet/store.h"
#include "chain-bridge/module/tx.h"
#include "common/crypto/hash.h"
#include "common/hex.h"

namespace ts::bridge::devnet::rpc_json {
namespace {

absl::string_view Absl(std::string_view s) { return {s.data(), s.size()}; }

// The hash CometBFT shows for an empty list (evidence, commit signatures): SHA-256 of nothing.
std::string EmptyHash() { return common::Sha256(""); }

Json PartSet(std::string_view hash) {
  return Json{{"total", hash.empty() ? 0 : 1}, {"hash", Hex(hash)}};
}

}  // namespace

Validator DevnetValidator(std::string_view chain_id) {
  std::string key = common::Sha256(absl::StrCat("trainshard devnet validator/", Absl(chain_id)));
  return Validator{common::Sha256(key).substr(0, 20), key};
}

std::string NodeId(std::string_view chain_id) {
  return common::HexEncode(DevnetValidator(chain_id).address);
}

std::string Hex(std::string_view bytes) { return common::HexEncodeUpper(bytes); }

std::string Base64(std::string_view bytes) { return absl::Base64Escape(Absl(bytes)); }

std::string Rfc3339Nano(const google::protobuf::Timestamp& time) {
  absl::Time t = absl::FromUnixSeconds(time.seconds()) + absl::Nanoseconds(time.nanos());
  return absl::FormatTime("%Y-%m-%d%ET%H:%M:%E9SZ", t, absl::UTCTimeZone());
}

Json BlockId(const tendermint::types::Header& header) {
  std::string hash = HeaderHash(header);
  return Json{{"hash", Hex(hash)}, {"parts", PartSet(common::Sha256(hash))}};
}

Json Header(const tendermint::types::Header& header, std::string_view proposer_address) {
  const std::string& last = header.last_block_id().hash();
  Json last_block_id = {{"hash", Hex(last)},
                        {"parts", PartSet(last.empty() ? "" : common::Sha256(last))}};
  return Json{{"version", {{"block", "11"}, {"app", "0"}}},
              {"chain_id", header.chain_id()},
              {"height", absl::StrCat(header.height())},
              {"time", Rfc3339Nano(header.time())},
              {"last_block_id", last_block_id},
              {"last_commit_hash", Hex(EmptyHash())},
              {"data_hash", Hex(header.data_hash())},
              {"validators_hash", Hex(common::Sha256(proposer_address))},
              {"next_validators_hash", Hex(common::Sha256(proposer_address))},
              {"consensus_hash", Hex(EmptyHash())},
              {"app_hash", Hex(header.app_hash())},
              {"last_results_hash", Hex(EmptyHash())},
              {"evidence_hash", Hex(EmptyHash())},
              {"proposer_address", Hex(proposer_address)}};
}

Json Block(const pb::StoredBlock& stored, std::string_view proposer_address) {
  const auto& header = stored.block().header();
  Json txs = Json::array();
  for (const auto& tx : stored.block().data().txs()) txs.push_back(Base64(tx));
  Json last_commit = {{"height", absl::StrCat(header.height() > 1 ? header.height() - 1 : 0)},
                      {"round", 0},
                      {"block_id",
                       {{"hash", Hex(header.last_block_id().hash())},
                        {"parts", PartSet(header.last_block_id().hash().empty()
                                              ? ""
                                              : common::Sha256(header.last_block_id().hash()))}}},
                      {"signatures", Json::array()}};
  return Json{{"block_id", BlockId(header)},
              {"block",
               {{"header", Header(header, proposer_address)},
                {"data", {{"txs", txs}}},
                {"evidence", {{"evidence", Json::array()}}},
                {"last_commit", last_commit}}}};
}

Json Events(const google::protobuf::RepeatedPtrField<tendermint::abci::Event>& events) {
  Json out = Json::array();
  for (const auto& event : events) {
    Json attributes = Json::array();
    for (const auto& a : event.attributes()) {
      attributes.push_back({{"key", a.key()}, {"value", a.value()}, {"index", a.index()}});
    }
    out.push_back({{"type", event.type()}, {"attributes", attributes}});
  }
  return out;
}

Json TxResult(const cosmos::base::abci::v1beta1::TxResponse& response) {
  return Json{{"code", response.code()},
              {"data", Base64(response.data())},
              {"log", response.raw_log()},
              {"info", response.info()},
              {"gas_wanted", absl::StrCat(response.gas_wanted())},
              {"gas_used", absl::StrCat(response.gas_used())},
              {"events", Events(response.events())},
              {"codespace", response.codespace()}};
}

Json TxRecord(const pb::StoredBlock& stored, int index) {
  const std::string& tx = stored.block().data().txs(index);
  return Json{{"hash", Hex(common::Sha256(tx))},
              {"height", absl::StrCat(stored.block().header().height())},
              {"index", index},
              {"tx_result", TxResult(stored.results().tx_results(index))},
              {"tx", Base64(tx)}};
}

Json BlockResults(const pb::StoredBlock& stored) {
  Json txs = Json::array();
  for (const auto& r : stored.results().tx_results()) txs.push_back(TxResult(r));
  return Json{{"height", absl::StrCat(stored.block().header().height())},
              {"txs_results", txs},
              {"finalize_block_events", Events(stored.results().end_block_events())},
              {"validator_updates", Json::array()},
              {"consensus_param_updates", nullptr},
              {"app_hash", Base64(stored.results().app_hash())}};
}

}  // namespace ts::bridge::devnet::rpc_json
