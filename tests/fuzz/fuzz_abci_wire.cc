// Fuzz target: the ABCI socket protocol's framing and Request decoding, the first code to touch
// what a peer sends on the ABCI port. Reads length-prefixed Requests off the input as the server
// does; checks that a prefix is refused only with INVALID_ARGUMENT, that an accepted one is
// canonical (writing its value back gives the same bytes) and within ten bytes, and that a
// Request that decodes survives a write and a second read unchanged in size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "chain-bridge/devnet/abci_wire.h"
#include "common/status.h"
#include "tendermint/abci/types.pb.h"

namespace {

namespace devnet = ts::bridge::devnet;

// The server's default cap on one message; a longer one closes the connection.
constexpr uint64_t kMaxMessageBytes = 64 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  // At most 64 messages per input, as a connection's reader loops over its buffer.
  for (int messages = 0; messages < 64 && !input.empty(); ++messages) {
    auto prefix = devnet::ParseLengthPrefix(input);
    if (!prefix.ok()) {
      TS_CHECK(prefix.status().code() == absl::StatusCode::kInvalidArgument);
      return 0;
    }
    if (!prefix->complete) {
      TS_CHECK(input.size() < devnet::kMaxLengthPrefixBytes);
      return 0;
    }
    TS_CHECK(prefix->prefix_bytes >= 1 && prefix->prefix_bytes <= devnet::kMaxLengthPrefixBytes);
    std::string written;
    devnet::AppendLengthPrefix(prefix->length, &written);
    TS_CHECK(written == input.substr(0, prefix->prefix_bytes));
    if (prefix->length > kMaxMessageBytes) return 0;
    input.remove_prefix(prefix->prefix_bytes);
    if (input.size() < prefix->length) return 0;  // the rest has not arrived
    tendermint::abci::Request request;
    const bool parsed = request.ParseFromArray(input.data(), static_cast<int>(prefix->length));
    input.remove_prefix(prefix->length);
    if (!parsed) return 0;
    std::string framed;
    devnet::AppendDelimited(request, &framed);
    auto again = devnet::ParseLengthPrefix(framed);
    TS_CHECK(again.ok() && again->complete);
    TS_CHECK(again->prefix_bytes + again->length == framed.size());
    tendermint::abci::Request reread;
    TS_CHECK(reread.ParseFromArray(framed.data() + again->prefix_bytes,
                                   static_cast<int>(again->length)));
    TS_CHECK(reread.ByteSizeLong() == request.ByteSizeLong());
  }
  return 0;
}
