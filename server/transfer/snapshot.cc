#include "transfer/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "transfer/chunk_format.h"

namespace pagoda {
namespace {

constexpr char kMagic[8] = {'P', 'A', 'G', 'O', 'D', 'A', 'K', 'V'};
constexpr uint32_t kVersion = 1;
constexpr const char* kManifest = "MANIFEST";
// Chunks of a snapshot file are larger than the wire's: nothing limits them
// but memory, and fewer records mean fewer syscalls.
constexpr int64_t kFileChunkBytes = int64_t{8} << 20;
constexpr uint32_t kMaxRecordBytes = uint32_t{1} << 30;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string errno_text() { return std::strerror(errno); }

std::string hex(std::string_view s) {
  std::string out;
  for (unsigned char c : s) out += fmt::format("{:02x}", c);
  return out;
}

std::optional<std::string> unhex(std::string_view s) {
  if (s.size() % 2 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < s.size(); i += 2) {
    unsigned value = 0;
    for (size_t j = i; j < i + 2; ++j) {
      const char c = s[j];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return std::nullopt;
      value = value * 16 + static_cast<unsigned>(d);
    }
    out.push_back(static_cast<char>(value));
  }
  return out;
}

// A file written whole or not at all: to `path`.tmp, fsynced, renamed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  }
  ~AtomicFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  Status opened() const {
    return fd_ >= 0 ? Status::Ok() : Internal("snapshot: cannot create {}: {}", tmp_, errno_text());
  }
  Status write(const void* data, size_t bytes) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Internal("snapshot: writing {}: {}", tmp_, errno_text());
      p += n;
      bytes -= static_cast<size_t>(n);
      written_ += n;
    }
    return Status::Ok();
  }
  Status commit() {
    if (::fsync(fd_) != 0) return Internal("snapshot: fsync {}: {}", tmp_, errno_text());
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string why = errno_text();
      ::unlink(tmp_.c_str());
      return Internal("snapshot: rename {} to {}: {}", tmp_, path_, why);
    }
    return Status::Ok();
  }
  int64_t written() const { return written_; }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  int64_t written_ = 0;
};

Status sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Internal("snapshot: open directory {}: {}", dir, errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? Status::Ok() : Internal("snapshot: fsync directory {}: {}", dir, errno_text());
}

Status write_record(AtomicFile& file, const v1::SequenceChunk& chunk, std::string& buffer) {
  buffer.clear();
  chunk.SerializeToString(&buffer);
  const auto n = static_cast<uint32_t>(buffer.size());
  const unsigned char len[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                                static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  PAGODA_RETURN_IF_ERROR(file.write(len, sizeof len));
  return file.write(buffer.data(), buffer.size());
}

std::string file_name(SequenceId id) { return fmt::format("seq-{:016x}.pgkv", id); }

// One sequence into its file; returns the file's bytes.
StatusOr<int64_t> write_sequence(const SnapshotContext& c, BackendStream& stream, const SequenceCut& cut,
                                 const std::string& path) {
  StatusOr<ExportChunks> chunks = ExportChunks::create(cut, {}, *c.backend, kFileChunkBytes);
  PAGODA_RETURN_IF_ERROR(chunks.status());
  AtomicFile file(path);
  PAGODA_RETURN_IF_ERROR(file.opened());
  PAGODA_RETURN_IF_ERROR(file.write(kMagic, sizeof kMagic));
  const unsigned char version[4] = {kVersion, 0, 0, 0};
  PAGODA_RETURN_IF_ERROR(file.write(version, sizeof version));
  v1::SequenceChunk chunk;
  std::string buffer;
  chunks->header(&chunk);
  PAGODA_RETURN_IF_ERROR(write_record(file, chunk, buffer));
  for (;;) {
    StatusOr<bool> more = chunks->next(stream, &chunk);
    PAGODA_RETURN_IF_ERROR(more.status());
    if (!*more) break;
    PAGODA_RETURN_IF_ERROR(write_record(file, chunk, buffer));
  }
  const int64_t bytes = file.written();
  PAGODA_RETURN_IF_ERROR(file.commit());
  return bytes;
}

struct ManifestEntry {
  SequenceId id = 0;
  std::string tenant;
  std::string file;
  int64_t bytes = 0;
};

struct Manifest {
  SequenceIdGenerator::State ids;
  std::vector<ManifestEntry> entries;
};

StatusOr<Manifest> read_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Internal("snapshot: cannot read {}", path);
  Manifest m;
  std::string line;
  int64_t line_no = 0;
  bool header = false;
  bool end = false;
  bool have_key = false;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream fields(line);
    std::string word;
    fields >> word;
    auto bad = [&] { return Internal("snapshot: {} line {}: expected a manifest line, received '{}'", path, line_no, line); };
    if (!header) {
      uint32_t version = 0;
      if (word != "pagoda-snapshot" || !(fields >> version) || version != kVersion) return bad();
      header = true;
    } else if (word == "id_key") {
      for (uint64_t& k : m.ids.key) {
        std::string h;
        if (!(fields >> h) || h.size() != 16) return bad();
        k = std::stoull(h, nullptr, 16);
      }
      have_key = true;
    } else if (word == "id_counter") {
      if (!(fields >> m.ids.counter)) return bad();
    } else if (word == "sequence") {
      ManifestEntry e;
      std::string id_hex;
      std::string tenant_hex;
      if (!(fields >> id_hex >> tenant_hex >> e.file >> e.bytes) || id_hex.size() != 16) return bad();
      e.id = std::stoull(id_hex, nullptr, 16);
      std::optional<std::string> tenant = unhex(tenant_hex);
      if (!tenant || e.file.find('/') != std::string::npos) return bad();
      e.tenant = *tenant;
      m.entries.push_back(std::move(e));
    } else if (word == "end") {
      size_t n = 0;
      if (!(fields >> n) || n != m.entries.size()) return bad();
      end = true;
      break;
    } else if (!word.empty()) {
      return bad();
    }
  }
  if (!header || !have_key || !end) {
    return Internal("snapshot: {}: expected a complete manifest (header, id_key, end line), received {} lines", path,
                    line_no);
  }
  return m;
}

// One file's chunks, checked as an import checks them.
Status read_sequence(const std::string& path, int64_t expected_bytes, ImportAssembler& assembler, int64_t* read) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Internal("cannot open: {}", errno_text());
  in.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  if (size != expected_bytes) {
    return DataLoss("size: expected {} bytes (the manifest's), received {}", expected_bytes, size);
  }
  char magic[sizeof kMagic];
  unsigned char version[4];
  if (!in.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof kMagic) != 0 ||
      !in.read(reinterpret_cast<char*>(version), sizeof version) || version[0] != kVersion) {
    return DataLoss("expected the magic PAGODAKV and version {}", kVersion);
  }
  int64_t at = sizeof kMagic + sizeof version;
  v1::SequenceChunk chunk;
  std::string buffer;
  while (at < size) {
    unsigned char len[4];
    if (size - at < 4 || !in.read(reinterpret_cast<char*>(len), sizeof len)) return DataLoss("truncated at byte {}", at);
    const uint32_t n = uint32_t{len[0]} | uint32_t{len[1]} << 8 | uint32_t{len[2]} << 16 | uint32_t{len[3]} << 24;
    at += 4;
    if (n > kMaxRecordBytes || n > size - at) return DataLoss("record at byte {}: length {} past the end", at - 4, n);
    buffer.resize(n);
    if (!in.read(buffer.data(), n)) return DataLoss("truncated at byte {}", at);
    if (!chunk.ParseFromString(buffer)) return DataLoss("record at byte {}: not a SequenceChunk", at - 4);
    at += n;
    PAGODA_RETURN_IF_ERROR(assembler.add(chunk));
  }
  *read = size;
  return assembler.finish();
}

}  // namespace

StatusOr<SnapshotStats> write_snapshot(const SnapshotContext& c) {
  const auto t0 = Clock::now();
  SnapshotStats stats;
  if (::mkdir(c.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Internal("snapshot: cannot create directory {}: {}", c.dir, errno_text());
  }
  StatusOr<std::unique_ptr<BackendStream>> stream = c.backend->open_stream();
  PAGODA_RETURN_IF_ERROR(stream.status());
  std::string manifest = fmt::format("pagoda-snapshot {}\n", kVersion);
  int64_t listed = 0;
  for (SequenceId id : c.cache->sequence_ids()) {
    SequenceCut cut;
    if (!c.cache->cut(id, std::nullopt, cut).ok()) continue;  // freed meanwhile
    const std::string name = file_name(id);
    StatusOr<int64_t> bytes = write_sequence(c, **stream, cut, c.dir + "/" + name);
    if (!bytes.ok()) {
      spdlog::error("snapshot: sequence {} not written: {}", id, bytes.status().message());
      ++stats.failures;
      continue;
    }
    manifest += fmt::format("sequence {:016x} {} {} {}\n", id, hex(c.tenant_name(cut.tenant)), name, *bytes);
    stats.bytes += *bytes;
    ++listed;
  }
  // The key and counter after every id handed out: the next server continues there.
  const SequenceIdGenerator::State ids = c.cache->id_state();
  manifest += fmt::format("id_key {:016x} {:016x} {:016x} {:016x}\nid_counter {}\nend {}\n", ids.key[0], ids.key[1],
                          ids.key[2], ids.key[3], ids.counter, listed);
  AtomicFile file(c.dir + "/" + kManifest);
  PAGODA_RETURN_IF_ERROR(file.opened());
  PAGODA_RETURN_IF_ERROR(file.write(manifest.data(), manifest.size()));
  PAGODA_RETURN_IF_ERROR(file.commit());
  PAGODA_RETURN_IF_ERROR(sync_dir(c.dir));
  stats.bytes += static_cast<int64_t>(manifest.size());
  stats.sequences = listed;
  stats.seconds = seconds_since(t0);
  return stats;
}

StatusOr<bool> restore_snapshot_ids(const SnapshotContext& c) {
  const std::string path = c.dir + "/" + kManifest;
  if (::access(path.c_str(), F_OK) != 0) return false;
  StatusOr<Manifest> m = read_manifest(path);
  PAGODA_RETURN_IF_ERROR(m.status());
  c.cache->restore_id_state(m->ids);
  return true;
}

SnapshotStats restore_snapshot(const SnapshotContext& c) {
  const auto t0 = Clock::now();
  SnapshotStats stats;
  const std::string manifest_path = c.dir + "/" + kManifest;
  if (::access(manifest_path.c_str(), F_OK) != 0) return stats;
  StatusOr<Manifest> m = read_manifest(manifest_path);
  if (!m.ok()) {
    spdlog::error("snapshot: skipping {}: {}", manifest_path, m.status().message());
    ::rename(manifest_path.c_str(), (manifest_path + ".failed").c_str());
    stats.failures = 1;
    stats.seconds = seconds_since(t0);
    return stats;
  }
  StatusOr<std::unique_ptr<BackendStream>> stream = c.backend->open_stream();
  for (const ManifestEntry& e : m->entries) {
    const std::string path = c.dir + "/" + e.file;
    ImportAssembler assembler(*c.backend, c.max_label_bytes, c.max_sequence_tokens);
    int64_t read = 0;
    Status status = stream.ok() ? read_sequence(path, e.bytes, assembler, &read) : stream.status();
    std::optional<TenantId> tenant;
    if (status.ok()) {
      tenant = c.tenant_id(e.tenant);
      if (!tenant) status = FailedPrecondition("tenant '{}': expected a tenant of --auth-tokens, received none", e.tenant);
    }
    if (status.ok() && assembler.header().into_sequence_id() != 0) {
      status = InvalidArgument("header.into_sequence_id: expected 0 in a snapshot, received {}",
                               assembler.header().into_sequence_id());
    }
    if (status.ok()) {
      ImportRequest request = assembler.request(*tenant);
      request.restore_id = e.id;
      status = c.cache->import_rows(**stream, request).status();
    }
    if (!status.ok()) {
      spdlog::error("snapshot: skipping {} (sequence {:016x}): {}", path, e.id, status.message());
      ::rename(path.c_str(), (path + ".failed").c_str());
      ++stats.failures;
      continue;
    }
    ::unlink(path.c_str());
    stats.bytes += read;
    ++stats.sequences;
  }
  ::unlink(manifest_path.c_str());
  (void)sync_dir(c.dir);
  stats.seconds = seconds_since(t0);
  return stats;
}

}  // namespace pagoda
