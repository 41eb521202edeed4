// The OpenAPI 3 description of the server's HTTP API, served at GET /openapi.json (and used
// by the schemathesis run in the e2e suite). Request and response schemas follow the exact
// shapes the server writes, including the OpenAI error object.
#pragma once

#include <string_view>

namespace peng::server {

// A JSON document; `served_model_name` does not appear in it (any string is a model).
std::string_view OpenApiJson();

}  // namespace peng::server
