#pragma once
// Protobuf wire encoding of grpc.health.v1's two messages:
//   HealthCheckRequest  { string service = 1; }         -> tag 0x0A, length, bytes
//   HealthCheckResponse { ServingStatus status = 1; }   -> tag 0x08, varint

#include <optional>
#include <string>
#include <string_view>

namespace pagoda::client::health_wire {

std::string encode_check_request(std::string_view service);
// The status enum number, or nullopt for malformed bytes. Unknown fields are
// skipped as protobuf requires; a missing status field means 0 (UNKNOWN).
std::optional<int> decode_check_response(std::string_view bytes);

}  // namespace pagoda::client::health_wire
