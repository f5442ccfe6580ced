#include "scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

namespace pagoda::testing {

namespace {

std::string base64(const std::string& in) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    const size_t n = std::min<size_t>(3, in.size() - i);
    uint32_t bits = 0;
    for (size_t j = 0; j < 3; ++j) bits = bits << 8 | (j < n ? static_cast<uint8_t>(in[i + j]) : 0u);
    for (size_t j = 0; j < 4; ++j) out += j <= n ? kDigits[(bits >> (18 - 6 * j)) & 63] : '=';
  }
  return out;
}

}  // namespace

HttpReply http_get_loopback(int port, const std::string& path, const std::string& basic_auth) {
  HttpReply reply;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    reply.error = std::string("socket: ") + std::strerror(errno);
    return reply;
  }
  timeval timeout{5, 0};  // a hung server fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    reply.error = "connect to 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno);
    ::close(fd);
    return reply;
  }
  const std::string auth = basic_auth.empty() ? "" : "Authorization: Basic " + base64(basic_auth) + "\r\n";
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n" + auth + "\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    reply.error = std::string("send: ") + std::strerror(errno);
    ::close(fd);
    return reply;
  }
  std::string raw;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      raw.append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0) {
      break;
    } else {
      reply.error = std::string("recv: ") + std::strerror(errno);
      ::close(fd);
      return reply;
    }
  }
  ::close(fd);

  const std::size_t header_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/", 0) != 0 || header_end == std::string::npos) {
    reply.error = "not an HTTP reply: " + raw.substr(0, 80);
    return reply;
  }
  reply.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  reply.body = raw.substr(header_end + 4);
  return reply;
}

namespace {

// Parses `{a="x",b="y"}` starting at text[pos] == '{'; returns the position after '}'.
std::size_t parse_labels(const std::string& text, std::size_t pos, LabelSet& labels, bool& ok) {
  ++pos;
  while (pos < text.size() && text[pos] != '}') {
    const std::size_t eq = text.find('=', pos);
    if (eq == std::string::npos || eq + 1 >= text.size() || text[eq + 1] != '"') {
      ok = false;
      return text.size();
    }
    const std::string key = text.substr(pos, eq - pos);
    std::string value;
    std::size_t i = eq + 2;
    for (; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] == '\\' && i + 1 < text.size()) {
        ++i;
        value += text[i] == 'n' ? '\n' : text[i];
      } else {
        value += text[i];
      }
    }
    if (i >= text.size()) {
      ok = false;
      return text.size();
    }
    labels[key] = value;
    pos = i + 1;
    if (pos < text.size() && text[pos] == ',') ++pos;
  }
  if (pos >= text.size()) ok = false;
  return pos + 1;
}

}  // namespace

Exposition parse_exposition(const std::string& text, std::vector<std::string>* errors) {
  Exposition result;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream words(line.substr(7));
      std::string name, type;
      words >> name >> type;
      result.types[name] = type;
      continue;
    }
    if (line[0] == '#') continue;
    Sample sample;
    bool ok = true;
    std::size_t pos = line.find_first_of("{ ");
    sample.name = line.substr(0, pos);
    if (pos != std::string::npos && line[pos] == '{') pos = parse_labels(line, pos, sample.labels, ok);
    if (ok && pos < line.size()) {
      try {
        std::size_t used = 0;
        const std::string value = line.substr(pos + 1);
        sample.value = value == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(value, &used);
      } catch (const std::exception&) {
        ok = false;
      }
    } else {
      ok = false;
    }
    if (ok) {
      result.samples.push_back(std::move(sample));
    } else if (errors != nullptr) {
      errors->push_back(line);
    }
  }
  return result;
}

std::optional<double> Exposition::value(const std::string& name, const LabelSet& labels) const {
  for (const Sample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

std::vector<Sample> Exposition::all(const std::string& name) const {
  std::vector<Sample> out;
  for (const Sample& s : samples) {
    if (s.name == name) out.push_back(s);
  }
  return out;
}

}  // namespace pagoda::testing
