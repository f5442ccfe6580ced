#pragma once
// Test helpers: fetch a Prometheus text exposition over plain HTTP, and parse it into
// samples that tests can look up by name and exact label set.

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pagoda::testing {

struct HttpReply {
  int status = 0;    // HTTP status code; 0 when the request could not be made
  std::string body;
  std::string error;  // why status is 0
};

// GET http://127.0.0.1:PORT/PATH with HTTP/1.0 (the server closes after the body);
// `basic_auth` "USER:PASSWORD" sends it as HTTP basic auth (empty: none).
HttpReply http_get_loopback(int port, const std::string& path, const std::string& basic_auth = "");

using LabelSet = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  LabelSet labels;
  double value = 0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // family name -> "counter", "histogram", ...

  // The value of the sample with exactly this name and label set.
  std::optional<double> value(const std::string& name, const LabelSet& labels = {}) const;
  // Every sample of `name`.
  std::vector<Sample> all(const std::string& name) const;
};

// Parses the text format (version 0.0.4). Malformed lines end up in `errors`.
Exposition parse_exposition(const std::string& text, std::vector<std::string>* errors);

}  // namespace pagoda::testing
