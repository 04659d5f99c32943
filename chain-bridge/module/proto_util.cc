#include "chain-bridge/module/proto_util.h"

#include <vector>

#include "chain-bridge/module/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"

namespace ts::bridge {
namespace {

// Returns the full name of the first message (depth-first) that holds unknown fields, or "".
// Walks the descriptor's message-typed fields rather than listing the set fields, so a leaf
// message (most of a large tx) costs one check and no allocation.
std::string FindUnknownFields(const google::protobuf::Message& msg, int depth) {
  const google::protobuf::Reflection* reflection = msg.GetReflection();
  if (!reflection->GetUnknownFields(msg).empty()) {
    const auto& unknown = reflection->GetUnknownFields(msg);
    return Cat("unknown field ", unknown.field(0).number(), " in ",
               msg.GetDescriptor()->full_name());
  }
  if (depth > 64) return Cat("nesting deeper than 64 in ", msg.GetDescriptor()->full_name());
  const google::protobuf::Descriptor* descriptor = msg.GetDescriptor();
  for (int f = 0; f < descriptor->field_count(); ++f) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(f);
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      int n = reflection->FieldSize(msg, field);
      for (int i = 0; i < n; ++i) {
        std::string found =
            FindUnknownFields(reflection->GetRepeatedMessage(msg, field, i), depth + 1);
        if (!found.empty()) return found;
      }
    } else if (reflection->HasField(msg, field)) {
      std::string found = FindUnknownFields(reflection->GetMessage(msg, field), depth + 1);
      if (!found.empty()) return found;
    }
  }
  return "";
}

}  // namespace

absl::Status ParseMessageStrict(std::string_view field, std::string_view bytes,
                                google::protobuf::Message* msg) {
  msg->Clear();
  if (!msg->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(Cat(field, ": ", bytes.size(), " bytes are not a valid ",
                                          msg->GetDescriptor()->full_name()));
  }
  std::string unknown = FindUnknownFields(*msg, 0);
  if (!unknown.empty()) {
    return absl::InvalidArgumentError(Cat(field, ": ", unknown));
  }
  return absl::OkStatus();
}

}  // namespace ts::bridge
