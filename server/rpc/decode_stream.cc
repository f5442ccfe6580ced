// DecodeStream: one bidirectional stream carries many Decode requests. Requests
// are validated as they are read and handed to the engine; responses go out in
// request order (one write at a time, as gRPC requires), each with its
// request_id. A failed request is answered with DecodeResponse.error and the
// stream carries on. At most --max-stream-in-flight requests are in flight per stream: the
// next read waits for a write, so a fast sender cannot grow the server's memory.
//
// The stream carries raw bytes and parses each message itself: gRPC's typed
// reader reports a message that does not parse like the end of the stream. A
// message that does not parse ends the stream, once every earlier request is
// answered, with INVALID_ARGUMENT naming its place ("DecodeStream message 2");
// one larger than --max-message-bytes is answered with RESOURCE_EXHAUSTED and
// the stream carries on.
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <grpcpp/support/byte_buffer.h>
#include <spdlog/spdlog.h>

#include "rpc/admission.h"
#include "rpc/decode_response.h"
#include "rpc/grpc_status.h"
#include "rpc/service.h"
#include "rpc/stream_framing.h"

namespace pagoda {

class DecodeStreamCall final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `auth_generation`: the authenticator's generation read before `tenant` was found.
  DecodeStreamCall(DecodeAttentionService& service, const grpc::CallbackServerContext& ctx, TenantId tenant,
                   uint64_t auth_generation)
      : service_(service),
        deadline_(ctx.deadline()),
        authorization_(DecodeAttentionService::authorization_of(ctx)),
        auth_generation_(auth_generation),
        tenant_(tenant) {
    service_.register_stream(this);
    start_read();
  }

  // The server drains: answer what was read, read no more, finish UNAVAILABLE.
  void drain() {
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mu_);
      draining_ = true;
      reads_done_ = true;
      plan_locked(act);
    }
    run(act);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Actions act;
      {
        std::lock_guard<std::mutex> lock(mu_);
        read_outstanding_ = false;
        reads_done_ = true;
        plan_locked(act);
      }
      run(act);
      return;
    }
    std::unique_ptr<Slot> slot = std::move(reading_);
    slot->received = EngineClock::now();
    const int64_t index = ++messages_read_;
    bool refuse = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Finished already (drain, nothing pending): the message is dropped and
      // the stream's UNAVAILABLE status tells the client.
      if (finished_) return;
      refuse = draining_;
    }
    const auto wire_bytes = static_cast<int64_t>(slot->raw.Length());
    const Status framed =
        read_stream_message(index, slot->raw, service_.settings().max_message_bytes, slot->request);
    if (framed.code() == StatusCode::kInvalidArgument) {
      end_reads_with(framed);
      return;
    }
    slot->raw.Clear();
    Engine& engine = service_.engine();
    Status status = refuse ? draining_status() : framed;
    if (status.ok()) status = still_authenticated();
    if (status.ok()) {
      engine.note_arriving();
      status = admit_decode(slot->request, wire_bytes, service_.settings(), slot->work, slot->response,
                            service_.sources_of(tenant_));
      slot->work.tenant = tenant_;
      engine.note_arrived();
    }
    Slot* raw = slot.get();
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mu_);
      read_outstanding_ = false;
      // A drain may have finished the stream while this request was validated.
      if (finished_) return;
      pending_.push_back(std::move(slot));
      if (!status.ok()) fail_slot_locked(*raw, status);
      if (!reads_done_ && pending_.size() < max_pending()) act.read = true;
      plan_locked(act);
    }
    if (status.ok()) {
      raw->work.deadline = deadline_;
      raw->work.done = raw;
      engine.submit(&raw->work);  // may complete (and be written) at once
    }
    run(act);
  }

  void OnWriteDone(bool ok) override {
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      pending_.pop_front();
      if (!ok) write_failed_ = true;  // the client is gone: finish once the engine is done
      if (!reads_done_ && !read_outstanding_ && pending_.size() < max_pending()) act.read = true;
      plan_locked(act);
    }
    run(act);
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& slot : pending_) slot->work.cancelled.store(true, std::memory_order_relaxed);
  }

  void OnDone() override {
    service_.unregister_stream(this);
    delete this;
  }

 private:
  size_t max_pending() const { return static_cast<size_t>(service_.settings().max_stream_in_flight); }

  // The stream's token checked again once the tokens were reloaded (SIGHUP):
  // a revoked one fails every later request UNAUTHENTICATED, each counted. A
  // refused stream keeps checking, so a token put back works again.
  Status still_authenticated() {
    const Authenticator& auth = service_.auth();
    if (!auth.enabled()) return Status::Ok();
    const uint64_t generation = auth.generation();
    if (generation == auth_generation_ && auth_status_.ok()) return Status::Ok();
    auth_generation_ = generation;
    StatusOr<TenantId> tenant =
        service_.tenant_for(authorization_ ? std::optional<std::string_view>(*authorization_) : std::nullopt);
    auth_status_ = tenant.status();
    if (tenant.ok()) tenant_ = *tenant;
    return auth_status_;
  }

  struct Slot final : public WorkDone {
    DecodeStreamCall* call = nullptr;
    grpc::ByteBuffer raw;  // the message as read, then the response as written
    v1::DecodeRequest request;
    v1::DecodeResponse response;
    DecodeWork work;
    EngineClock::time_point received;
    bool ready = false;
    void work_done(const Status& status) override { call->on_work_done(*this, status); }
  };

  // gRPC operations decided under mu_ and started after it is released.
  struct Actions {
    bool read = false;
    Slot* write = nullptr;
    bool finish = false;
    grpc::Status finish_status;
  };

  void start_read() {
    reading_ = std::make_unique<Slot>();
    reading_->call = this;
    StartRead(&reading_->raw);
  }

  // A message that did not parse: no more reads; what was read is answered,
  // then the stream ends with `status`.
  void end_reads_with(const Status& status) {
    spdlog::warn("DecodeStream failed: {}", status.message());
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mu_);
      read_outstanding_ = false;
      reads_done_ = true;
      framing_error_ = status;
      plan_locked(act);
    }
    run(act);
  }

  void on_work_done(Slot& slot, const Status& status) {
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (status.ok()) {
        const double total_us =
            std::chrono::duration<double, std::micro>(EngineClock::now() - slot.received).count();
        finish_response(slot.work, service_.settings().mode, total_us, slot.response);
        service_.observe_call(RpcMethod::kDecodeStream, slot.received, status);
        slot.ready = true;
      } else {
        fail_slot_locked(slot, status);
      }
      plan_locked(act);
    }
    run(act);
  }

  void fail_slot_locked(Slot& slot, const Status& status) {
    service_.observe_call(RpcMethod::kDecodeStream, slot.received, status,
                          fmt::format("request_id={} layer={}", slot.request.request_id(), slot.request.layer()));
    slot.response.Clear();
    slot.response.set_request_id(slot.request.request_id());
    slot.response.mutable_error()->set_code(static_cast<int>(status.code()));
    slot.response.mutable_error()->set_message(status.message());
    slot.ready = true;
  }

  // Under mu_: the next write (the oldest response, once ready) or the finish.
  void plan_locked(Actions& act) {
    if (finished_) {
      act.read = false;
      return;
    }
    if (act.read) read_outstanding_ = true;
    if (write_failed_) {
      while (!pending_.empty() && pending_.front()->ready) pending_.pop_front();
    } else if (!writing_ && !pending_.empty() && pending_.front()->ready) {
      writing_ = true;
      act.write = pending_.front().get();
    }
    if (reads_done_ && pending_.empty() && !writing_) {
      finished_ = true;
      act.finish = true;
      act.finish_status = !framing_error_.ok() ? to_grpc_status(framing_error_)
                          : draining_          ? to_grpc_status(draining_status())
                                               : grpc::Status::OK;
    }
  }

  void run(Actions& act) {
    if (act.read) start_read();
    if (act.write) {
      bool own = false;
      (void)grpc::SerializationTraits<v1::DecodeResponse>::Serialize(act.write->response, &act.write->raw, &own);
      StartWrite(&act.write->raw);
    }
    if (act.finish) Finish(act.finish_status);
  }

  DecodeAttentionService& service_;
  const std::chrono::system_clock::time_point deadline_;  // the stream's, for each request
  int64_t messages_read_ = 0;                              // reads are one at a time
  std::mutex mu_;
  std::unique_ptr<Slot> reading_;              // the slot the outstanding read fills
  std::deque<std::unique_ptr<Slot>> pending_;  // in request order; the front is written next
  bool read_outstanding_ = true;               // the constructor starts the first read
  bool reads_done_ = false;                    // no more requests will be taken
  bool writing_ = false;
  bool write_failed_ = false;
  bool draining_ = false;
  bool finished_ = false;
  Status framing_error_;  // a message that did not parse: the stream's final status
  // Read and written by OnReadDone only (reads are one at a time).
  const std::optional<std::string> authorization_;  // the stream's metadata, kept for a re-check
  uint64_t auth_generation_;                        // the tokens it was last checked against
  Status auth_status_;                              // that check's outcome
  TenantId tenant_;                                 // every request of the stream acts for it
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DecodeAttentionService::DecodeStream(
    grpc::CallbackServerContext* ctx) {
  // Refused before any request is read: draining, or not authenticated.
  class Refused final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    Refused(DecodeAttentionService& service, const Status& status) {
      service.observe_call(RpcMethod::kDecodeStream, EngineClock::now(), status);
      Finish(to_grpc_status(status));
    }
    void OnDone() override { delete this; }
  };
  if (draining()) return new Refused(*this, draining_status());
  const uint64_t auth_generation = auth_.generation();  // before the check: a reload after it is seen
  StatusOr<TenantId> tenant = tenant_of(*ctx);
  if (!tenant.ok()) return new Refused(*this, tenant.status());
  return new DecodeStreamCall(*this, *ctx, *tenant, auth_generation);
}

void DecodeAttentionService::register_stream(DecodeStreamCall* call) {
  call_started();
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.insert(call);
}

void DecodeAttentionService::unregister_stream(DecodeStreamCall* call) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.erase(call);
  call_done();
}

void DecodeAttentionService::begin_drain() {
  draining_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(streams_mu_);
  for (DecodeStreamCall* call : streams_) call->drain();
}

}  // namespace pagoda
