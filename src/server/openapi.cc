#include "server/openapi.h"

namespace peng::server {

std::string_view OpenApiJson() {
  static constexpr std::string_view kSpec = R"json({
  "openapi": "3.0.3",
  "info": {"title": "peng", "version": "0.1.0"},
  "paths": {}
})json";
  return kSpec;
}

}  // namespace peng::server
