// grpc::Status -> client Error, and the hand-encoded grpc.health.v1 messages.
#include <string>

#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

#include "health_wire.h"
#include "pagoda/client/grpc_error.h"

namespace pagoda::client {
namespace {

TEST(ErrorMapping, KeepsCodeMessageAndMethod) {
  const grpc::Status st(grpc::StatusCode::INVALID_ARGUMENT, "q.shape[1]: expected 8, received 4");
  const Error e = error_from_grpc(st, "Decode");
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e.code_number(), 3);
  EXPECT_EQ(e.code_name(), "INVALID_ARGUMENT");
  EXPECT_EQ(e.message(), "q.shape[1]: expected 8, received 4");
  EXPECT_EQ(e.method(), "Decode");
  EXPECT_EQ(e.to_string(), "Decode: INVALID_ARGUMENT (3): q.shape[1]: expected 8, received 4");
}

TEST(ErrorMapping, EveryGrpcCodeKeepsItsNumberAndName) {
  struct Case {
    grpc::StatusCode code;
    const char* name;
  };
  const Case cases[] = {
      {grpc::StatusCode::CANCELLED, "CANCELLED"},
      {grpc::StatusCode::UNKNOWN, "UNKNOWN"},
      {grpc::StatusCode::INVALID_ARGUMENT, "INVALID_ARGUMENT"},
      {grpc::StatusCode::DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"},
      {grpc::StatusCode::NOT_FOUND, "NOT_FOUND"},
      {grpc::StatusCode::ALREADY_EXISTS, "ALREADY_EXISTS"},
      {grpc::StatusCode::PERMISSION_DENIED, "PERMISSION_DENIED"},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED"},
      {grpc::StatusCode::FAILED_PRECONDITION, "FAILED_PRECONDITION"},
      {grpc::StatusCode::ABORTED, "ABORTED"},
      {grpc::StatusCode::OUT_OF_RANGE, "OUT_OF_RANGE"},
      {grpc::StatusCode::UNIMPLEMENTED, "UNIMPLEMENTED"},
      {grpc::StatusCode::INTERNAL, "INTERNAL"},
      {grpc::StatusCode::UNAVAILABLE, "UNAVAILABLE"},
      {grpc::StatusCode::DATA_LOSS, "DATA_LOSS"},
      {grpc::StatusCode::UNAUTHENTICATED, "UNAUTHENTICATED"},
  };
  for (const Case& c : cases) {
    const Error e = error_from_grpc(grpc::Status(c.code, "m"), "X");
    EXPECT_EQ(e.code_number(), static_cast<int>(c.code));
    EXPECT_EQ(e.code_name(), c.name);
  }
}

TEST(ErrorMapping, EmptyMessageAndUnknownNumbersStayReadable) {
  const Error e = error_from_grpc(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""), "GetConfig");
  EXPECT_EQ(e.message(), "(no message)");
  EXPECT_EQ(error_code_name(99), "CODE_99");
  EXPECT_EQ(error_code_name(-1), "CODE_-1");
}

TEST(ErrorMapping, ResultHoldsValueOrError) {
  Result<int> good = 7;
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 7);
  Result<int> bad = invalid_argument("layer: expected [0, 2), received 5");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.error().method(), "client");
}

TEST(HealthWire, RequestEncoding) {
  EXPECT_EQ(health_wire::encode_check_request(""), "");
  EXPECT_EQ(health_wire::encode_check_request("pagoda.v1.DecodeAttention"),
            std::string("\x0A\x19") + "pagoda.v1.DecodeAttention");
}

TEST(HealthWire, ResponseDecoding) {
  EXPECT_EQ(health_wire::decode_check_response(std::string("\x08\x01", 2)), 1);  // SERVING
  EXPECT_EQ(health_wire::decode_check_response(std::string("\x08\x02", 2)), 2);  // NOT_SERVING
  EXPECT_EQ(health_wire::decode_check_response(""), 0);  // default: UNKNOWN
  // An unknown length-delimited field before the status is skipped.
  EXPECT_EQ(health_wire::decode_check_response(std::string("\x12\x02xy\x08\x01", 6)), 1);
  EXPECT_FALSE(health_wire::decode_check_response(std::string("\x08", 1)).has_value());     // truncated varint
  EXPECT_FALSE(health_wire::decode_check_response(std::string("\x12\x05xy", 4)).has_value());  // overlong field
}

}  // namespace
}  // namespace pagoda::client
