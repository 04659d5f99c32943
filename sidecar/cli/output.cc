#include "sidecar/cli/output.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hex.h"
#include "common/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/type_resolver.h"
#include "google/protobuf/util/type_resolver_util.h"

namespace ts::sidecar {

namespace {

constexpr char kTypeUrlPrefix[] = "type.googleapis.com";

// Cosmos writes Any type URLs as "/<full name>" (e.g. "/cosmos.tx.v1beta1.Tx"), which protobuf's
// JSON printer does not resolve by default. This resolver takes the part after the last '/'
// whatever comes before it, and looks it up in the compiled-in descriptor pool.
class AnyTypeResolver final : public google::protobuf::util::TypeResolver {
 public:
  AnyTypeResolver()
      : pool_(google::protobuf::util::NewTypeResolverForDescriptorPool(
            kTypeUrlPrefix, google::protobuf::DescriptorPool::generated_pool())) {}

  google::protobuf::util::Status ResolveMessageType(const std::string& type_url,
                                                    google::protobuf::Type* type) override {
    return pool_->ResolveMessageType(Normalize(type_url), type);
  }
  google::protobuf::util::Status ResolveEnumType(const std::string& type_url,
                                                 google::protobuf::Enum* type) override {
    return pool_->ResolveEnumType(Normalize(type_url), type);
  }

 private:
  static std::string Normalize(const std::string& type_url) {
    size_t slash = type_url.rfind('/');
    std::string name = slash == std::string::npos ? type_url : type_url.substr(slash + 1);
    return std::string(kTypeUrlPrefix) + "/" + name;
  }
  std::unique_ptr<google::protobuf::util::TypeResolver> pool_;
};

google::protobuf::util::TypeResolver* Resolver() {
  // Built once; the descriptor-pool resolver only reads the (immutable) generated pool.
  static AnyTypeResolver* resolver = new AnyTypeResolver();
  return resolver;
}

absl::Status ToJson(const google::protobuf::Message& message, std::string* json) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  auto status = google::protobuf::util::BinaryToJsonString(
      Resolver(), std::string(kTypeUrlPrefix) + "/" + message.GetDescriptor()->full_name(),
      message.SerializeAsString(), json, options);
  if (!status.ok()) return absl::InvalidArgumentError(std::string(status.message()));
  return absl::OkStatus();
}

// Clears every google.protobuf.Any in `message` (without looking inside them).
void ClearAnyFields(google::protobuf::Message* message) {
  const google::protobuf::Reflection* reflection = message->GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(*message, &fields);
  for (const auto* field : fields) {
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->message_type()->full_name() == "google.protobuf.Any") {
      reflection->ClearField(message, field);
    } else if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(*message, field); ++i) {
        ClearAnyFields(reflection->MutableRepeatedMessage(message, field, i));
      }
    } else {
      ClearAnyFields(reflection->MutableMessage(message, field));
    }
  }
}

}  // namespace

std::string ProtoToJson(const google::protobuf::Message& message) {
  std::string json;
  absl::Status status = ToJson(message, &json);
  if (status.ok()) return json;
  // An Any of a type this build does not know (e.g. a message of a newer chain): print the
  // rest of the message without the Any fields rather than nothing.
  std::unique_ptr<google::protobuf::Message> copy(message.New());
  copy->CopyFrom(message);
  ClearAnyFields(copy.get());
  json.clear();
  if (ToJson(*copy, &json).ok()) return json;
  nlohmann::ordered_json error = {{"error", std::string(status.message())}};
  return error.dump();
}

nlohmann::ordered_json ProtoToJsonValue(const google::protobuf::Message& message) {
  return nlohmann::ordered_json::parse(ProtoToJson(message), /*cb=*/nullptr,
                                       /*allow_exceptions=*/false);
}

nlohmann::ordered_json EventToJson(int64_t height, uint32_t index,
                                   const tendermint::abci::Event& event) {
  nlohmann::ordered_json attributes = nlohmann::ordered_json::object();
  for (const auto& attribute : event.attributes()) {
    attributes[attribute.key()] = attribute.value();
  }
  return nlohmann::ordered_json{{"height", std::to_string(height)},
                                {"index", index},
                                {"type", event.type()},
                                {"attributes", std::move(attributes)}};
}

std::string ShortEnumName(const std::string& full_name, const std::string& prefix) {
  std::string name = full_name;
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

std::string EventAttribute(const tendermint::abci::Event& event, const std::string& key) {
  for (const auto& attribute : event.attributes()) {
    if (attribute.key() == key) return attribute.value();
  }
  return "";
}

void PrintKeyValues(std::ostream& out, const KeyValues& lines) {
  size_t width = 0;
  for (const auto& [key, value] : lines) width = std::max(width, key.size());
  for (const auto& [key, value] : lines) {
    out << key << ":" << std::string(width - key.size() + 1, ' ') << value << "\n";
  }
}

void PrintTable(std::ostream& out, const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  };
  measure(header);
  for (const auto& row : rows) measure(row);
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  };
  print(header);
  for (const auto& row : rows) print(row);
}

std::string EventLine(int64_t height, uint32_t index, const tendermint::abci::Event& event) {
  std::string line = absl::StrCat(height, "  ", index, "  ", event.type());
  for (const auto& attribute : event.attributes()) {
    absl::StrAppend(&line, "  ", attribute.key(), "=", attribute.value());
  }
  return line;
}

void PrintSettlement(std::ostream& out, const gonka::trainshard::v1::Settlement& s) {
  KeyValues lines = {
      {"shard_id", std::to_string(s.shard_id())},
      {"chain_id", s.chain_id()},
      {"final_checkpoint_root", common::HexEncode(s.final_checkpoint_root())},
      {"rounds_completed", std::to_string(s.rounds_completed())},
      {"rounds_planned", std::to_string(s.rounds_planned())},
      {"refund", s.refund()},
  };
  if (s.has_evaluation()) {
    lines.emplace_back("evaluation", absl::StrCat(s.evaluation().metric(), " = ",
                                                  s.evaluation().value_micro(), " (micro)"));
  }
  PrintKeyValues(out, lines);
  if (s.payouts_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& p : s.payouts()) {
      rows.push_back({p.host(), p.amount(), std::to_string(p.rounds_contributed()),
                      std::to_string(p.tokens()), std::to_string(p.verified()),
                      std::to_string(p.rejected()), std::to_string(p.marks())});
    }
    out << "\n";
    PrintTable(out, {"HOST", "PAYOUT", "ROUNDS", "TOKENS", "VERIFIED", "REJECTED", "MARKS"}, rows);
  }
}

}  // namespace ts::sidecar
