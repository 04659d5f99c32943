// The stored chain in CometBFT 0.38's JSON: blocks, headers, block ids, tx results, events,
// block results, as its JSON-RPC and WebSocket events carry them (int64 as strings, hashes as
// upper-case hex, byte strings as base64, times as RFC 3339 with nanoseconds). Internal to the
// devnet's RPC server. Pure functions; thread-safe.
#ifndef TS_CHAIN_BRIDGE_DEVNET_RPC_JSON_H_
#define TS_CHAIN_BRIDGE_DEVNET_RPC_JSON_H_

#include <string>
#include <string_view>

#include "cosmos/base/abci/v1beta1/abci.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "nlohmann/json.hpp"
#include "tendermint/abci/types.pb.h"
#include "tendermint/types/types.pb.h"

namespace ts::bridge::devnet::rpc_json {

namespace pb = ::gonka::trainshard::v1;
using Json = nlohmann::json;

// The devnet's one validator: it signs nothing (the node is the chain's only block producer),
// so its key is a fixed value derived from the chain id, shown where CometBFT shows one.
struct Validator {
  std::string address;     // 20 bytes
  std::string public_key;  // 32 bytes, shown as an Ed25519 key
};
Validator DevnetValidator(std::string_view chain_id);
// The node id shown in node info: the validator's address in lower-case hex (40 characters).
std::string NodeId(std::string_view chain_id);

// What the node says it is, in the status call and the tendermint gRPC service alike: the
// CometBFT version whose shapes it speaks (CosmJS picks its client by it), its protocol
// versions, moniker, and the application's version (abci_info's).
inline constexpr char kCometVersion[] = "0.38.17";
inline constexpr uint64_t kCometP2pVersion = 8;
inline constexpr uint64_t kCometBlockVersion = 11;
inline constexpr char kMoniker[] = "trainshard-devnet";
inline constexpr char kAppVersion[] = "devnet";

std::string Hex(std::string_view bytes);  // upper case
std::string Base64(std::string_view bytes);
std::string Rfc3339Nano(const google::protobuf::Timestamp& time);

Json BlockId(const tendermint::types::Header& header);
Json Header(const tendermint::types::Header& header, std::string_view proposer_address);
// {block_id, block} as `block` answers.
Json Block(const pb::StoredBlock& stored, std::string_view proposer_address);
Json Events(const google::protobuf::RepeatedPtrField<tendermint::abci::Event>& events);
// ABCI ExecTxResult of a delivered (or checked) tx.
Json TxResult(const cosmos::base::abci::v1beta1::TxResponse& response);
// {hash, height, index, tx_result, tx} as `tx` and `tx_search` answer.
Json TxRecord(const pb::StoredBlock& stored, int index);
Json BlockResults(const pb::StoredBlock& stored);

}  // namespace ts::bridge::devnet::rpc_json

#endif  // TS_CHAIN_BRIDGE_DEVNET_RPC_JSON_H_
