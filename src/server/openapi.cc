#include "server/openapi.h"

namespace peng::server {

// The document below is what the server does, field by field:
//   - request fields, types and ranges: protocol.cc (FieldReader, ParseCommon,
//     ParseCompletionFields, ParseChatFields, CheckPrompt) and SamplingParams::Validate();
//     every optional field may also be null (the same as absent), unknown fields are ignored;
//   - response shapes: responses.cc (FinalResponse, StreamChunk, UsageChunk, the logprobs
//     objects), Server::Models(), ApiError::ToJson() and the HTTP layer's own errors;
//   - statuses: Server::OnHeaders/OnRequest/Prepare/StartGeneration and http_server.cc.
// tests/e2e/test_schemathesis.py checks it against a live server.
std::string_view OpenApiJson() {
  static constexpr std::string_view kSpec = R"json({
  "openapi": "3.0.3",
  "info": {
    "title": "peng",
    "version": "0.1.0",
    "description": "OpenAI-compatible API of `peng serve`: text completions and chat completions (JSON, or Server-Sent Events with \"stream\": true), the served model, health, Prometheus metrics and this document. Unknown request fields are ignored; every optional field may be null, which is the same as leaving it out. Every error is OpenAI's error object. Besides the statuses listed per operation, any request may get 400 (malformed HTTP), 413 (body larger than `--max-body-bytes`), 431 (request headers too large) or 503 (too many open connections) from the HTTP layer itself."
  },
  "servers": [{"url": "/"}],
  "tags": [
    {"name": "openai", "description": "The OpenAI-compatible routes"},
    {"name": "operations", "description": "Health, metrics and this document"}
  ],
  "paths": {
    "/v1/completions": {
      "post": {
        "tags": ["openai"],
        "operationId": "createCompletion",
        "summary": "Text completion",
        "description": "Completes one or more prompts, each sampled `n` times. The prompt plus `max_tokens` must fit in the model's context (`max_model_len` of GET /v1/models). With `\"stream\": true` the answer is a stream of Server-Sent Events (see the 200 response).",
        "security": [{}, {"bearer": []}],
        "requestBody": {
          "required": true,
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CompletionRequest"}}}
        },
        "responses": {
          "200": {
            "description": "The completion: a JSON `text_completion` object, or with `\"stream\": true` Server-Sent Events: one `data: {json}` line per event, each a `CompletionChunk` (the first chunk of each choice carries the prompt when `echo` is set), then with `stream_options.include_usage` one chunk with empty `choices` and `usage`, then `data: [DONE]`. A generation that fails after the stream began sends `data: {\"error\": {...}}` (the Error object) before `data: [DONE]`.",
            "content": {
              "application/json": {"schema": {"$ref": "#/components/schemas/CompletionResponse"}},
              "text/event-stream": {"schema": {"$ref": "#/components/schemas/CompletionChunkEvent"}}
            }
          },
          "400": {"$ref": "#/components/responses/BadRequest"},
          "401": {"$ref": "#/components/responses/Unauthorized"},
          "404": {"$ref": "#/components/responses/NotFound"},
          "413": {"$ref": "#/components/responses/PayloadTooLarge"},
          "429": {"$ref": "#/components/responses/TooManyRequests"},
          "431": {"$ref": "#/components/responses/HeadersTooLarge"},
          "500": {"$ref": "#/components/responses/InternalError"},
          "503": {"$ref": "#/components/responses/ServiceUnavailable"}
        }
      }
    },
    "/v1/chat/completions": {
      "post": {
        "tags": ["openai"],
        "operationId": "createChatCompletion",
        "summary": "Chat completion",
        "description": "Renders `messages` with the model's own chat template, then completes it `n` times. Without `max_tokens` / `max_completion_tokens` generation may fill the rest of the context. With `\"stream\": true` the answer is a stream of Server-Sent Events (see the 200 response).",
        "security": [{}, {"bearer": []}],
        "requestBody": {
          "required": true,
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}}
        },
        "responses": {
          "200": {
            "description": "The chat completion: a JSON `chat.completion` object, or with `\"stream\": true` Server-Sent Events: one `data: {json}` line per event, each a `ChatCompletionChunk` (the first chunk of each choice has `delta.role` \"assistant\"), then with `stream_options.include_usage` one chunk with empty `choices` and `usage`, then `data: [DONE]`. A generation that fails after the stream began sends `data: {\"error\": {...}}` (the Error object) before `data: [DONE]`.",
            "content": {
              "application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionResponse"}},
              "text/event-stream": {"schema": {"$ref": "#/components/schemas/ChatCompletionChunkEvent"}}
            }
          },
          "400": {"$ref": "#/components/responses/BadRequest"},
          "401": {"$ref": "#/components/responses/Unauthorized"},
          "404": {"$ref": "#/components/responses/NotFound"},
          "413": {"$ref": "#/components/responses/PayloadTooLarge"},
          "429": {"$ref": "#/components/responses/TooManyRequests"},
          "431": {"$ref": "#/components/responses/HeadersTooLarge"},
          "500": {"$ref": "#/components/responses/InternalError"},
          "503": {"$ref": "#/components/responses/ServiceUnavailable"}
        }
      }
    },
    "/v1/models": {
      "get": {
        "tags": ["openai"],
        "operationId": "listModels",
        "summary": "The served model",
        "security": [{}, {"bearer": []}],
        "responses": {
          "200": {
            "description": "A list with the one served model",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelList"}}}
          },
          "400": {"$ref": "#/components/responses/BadRequest"},
          "401": {"$ref": "#/components/responses/Unauthorized"},
          "431": {"$ref": "#/components/responses/HeadersTooLarge"},
          "503": {"$ref": "#/components/responses/ServiceUnavailable"}
        }
      }
    },
    "/health": {
      "get": {
        "tags": ["operations"],
        "operationId": "health",
        "summary": "Liveness and readiness",
        "responses": {
          "200": {
            "description": "Serving",
            "content": {"text/plain": {"schema": {"type": "string", "enum": ["ok"]}}}
          },
          "400": {"$ref": "#/components/responses/BadRequest"},
          "431": {"$ref": "#/components/responses/HeadersTooLarge"},
          "503": {
            "description": "Draining after SIGTERM/SIGINT (text/plain \"draining\"), or too many open connections (the Error object)",
            "content": {
              "text/plain": {"schema": {"type": "string", "enum": ["draining"]}},
              "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
            }
          }
        }
      }
    },
    "/metrics": {
      "get": {
        "tags": ["operations"],
        "operationId": "metrics",
        "summary": "Prometheus metrics",
        "description": "Prometheus text exposition format 0.0.4 (`peng_` metrics, each with a `model_name` label). Needs the API key only with `--protect-metrics`.",
        "security": [{}, {"bearer": []}],
        "responses": {
          "200": {
            "description": "The metrics",
            "content": {"text/plain": {"schema": {"type": "string"}}}
          },
          "400": {"$ref": "#/components/responses/BadRequest"},
          "401": {"$ref": "#/components/responses/Unauthorized"},
          "431": {"$ref": "#/components/responses/HeadersTooLarge"},
          "503": {"$ref": "#/components/responses/ServiceUnavailable"}
        }
      }
    },
    "/openapi.json": {
      "get": {
        "tags": ["operations"],
        "operationId": "openapi",
        "summary": "This document",
        "responses": {
          "200": {
            "description": "The OpenAPI 3.0 description of this server",
            "content": {"application/json": {"schema": {"type": "object", "required": ["openapi", "info", "paths"]}}}
          },
          "400": {"$ref": "#/components/responses/BadRequest"},
          "431": {"$ref": "#/components/responses/HeadersTooLarge"},
          "503": {"$ref": "#/components/responses/ServiceUnavailable"}
        }
      }
    }
  },
  "components": {
    "securitySchemes": {
      "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "Only when the server runs with `--api-key KEY`: `Authorization: Bearer KEY` (scheme case-insensitive) on the /v1/ routes, and on /metrics with `--protect-metrics`. Without `--api-key` the header is ignored."
      }
    },
    "responses": {
      "BadRequest": {
        "description": "Invalid request: the body is not JSON or nests deeper than 64 levels (code `invalid_json`), a field has the wrong type (`invalid_type`) or is out of range (`invalid_value`), a required field is missing (`missing_required`), the prompt plus `max_tokens` exceeds the context (`context_length_exceeded`), an unsupported feature was asked for; or the HTTP request itself is malformed (`bad_request`)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
      },
      "Unauthorized": {
        "description": "The server has an API key and the request has none or another one (code `invalid_api_key`)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
      },
      "NotFound": {
        "description": "`model` names another model than the served one (code `model_not_found`, param `model`)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
      },
      "PayloadTooLarge": {
        "description": "The body is larger than `--max-body-bytes` (code `request_too_large`)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
      },
      "TooManyRequests": {
        "description": "The waiting queue is full (`--max-waiting`); type `rate_limit_error`",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
      },
      "HeadersTooLarge": {
        "description": "The request headers are too large (code `headers_too_large`)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
      },
      "InternalError": {
        "description": "The generation failed inside the engine (code `generation_failed`) or preparing the request failed; type `internal_error`",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
      },
      "ServiceUnavailable": {
        "description": "The server is draining after SIGTERM/SIGINT, or has too many open connections (code `too_many_connections`); type `service_unavailable`",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
      }
    },
    "schemas": {
      "Null": {"type": "string", "nullable": true, "enum": [null], "description": "JSON null (OpenAPI 3.0 has no null type)"},
      "ErrorResponse": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"$ref": "#/components/schemas/Error"}}
      },
      "Error": {
        "type": "object",
        "description": "OpenAI's error object",
        "required": ["message", "type", "param", "code"],
        "properties": {
          "message": {"type": "string"},
          "type": {"type": "string", "description": "invalid_request_error, rate_limit_error, internal_error or service_unavailable"},
          "param": {"type": "string", "nullable": true, "description": "The request field at fault"},
          "code": {"type": "string", "nullable": true, "description": "e.g. invalid_type, invalid_value, invalid_json, missing_required, context_length_exceeded, model_not_found, invalid_api_key, request_too_large"}
        }
      },
      "StopField": {
        "description": "Generation stops when the output contains one of these strings (not returned unless `include_stop_str_in_output`). Each string is 1 to 4096 bytes of UTF-8.",
        "anyOf": [
          {"type": "string", "minLength": 1, "maxLength": 4096},
          {"type": "array", "maxItems": 32, "items": {"type": "string", "minLength": 1, "maxLength": 4096}},
          {"$ref": "#/components/schemas/Null"}
        ]
      },
      "StreamOptions": {
        "type": "object",
        "nullable": true,
        "description": "Only allowed with `\"stream\": true`",
        "properties": {
          "include_usage": {"type": "boolean", "nullable": true, "default": false, "description": "A last chunk with empty `choices` carries `usage`; every chunk has a `usage` field (null)"},
          "continuous_usage_stats": {"type": "boolean", "nullable": true, "default": false, "description": "With include_usage: every chunk carries the usage so far (vLLM)"}
        }
      },
      "SamplingFields": {
        "type": "object",
        "description": "Fields both generation routes take",
        "properties": {
          "model": {"type": "string", "nullable": true, "description": "The served model name (GET /v1/models); another name is a 404. May be left out."},
          "temperature": {"type": "number", "nullable": true, "minimum": 0, "maximum": 2, "default": 1, "description": "0 is greedy decoding"},
          "top_p": {"type": "number", "nullable": true, "exclusiveMinimum": true, "minimum": 0, "maximum": 1, "default": 1},
          "top_k": {"type": "integer", "nullable": true, "minimum": -1, "maximum": 2147483646, "default": 0, "description": "0 or -1 disables (vLLM extension)"},
          "min_p": {"type": "number", "nullable": true, "minimum": 0, "maximum": 1, "default": 0, "description": "vLLM extension"},
          "repetition_penalty": {"type": "number", "nullable": true, "minimum": 0.01, "maximum": 100, "default": 1, "description": "vLLM extension"},
          "presence_penalty": {"type": "number", "nullable": true, "minimum": -2, "maximum": 2, "default": 0},
          "frequency_penalty": {"type": "number", "nullable": true, "minimum": -2, "maximum": 2, "default": 0},
          "seed": {"type": "integer", "format": "int64", "nullable": true, "minimum": -1, "maximum": 9223372036854775807, "description": "-1 or absent: a random seed. Choice i samples with seed + i, which must stay within int64."},
          "n": {"type": "integer", "nullable": true, "minimum": 1, "maximum": 128, "default": 1, "description": "Completions per prompt"},
          "best_of": {"type": "integer", "nullable": true, "minimum": 1, "maximum": 128, "description": "Must equal n"},
          "min_tokens": {"type": "integer", "nullable": true, "minimum": 0, "maximum": 2147483647, "default": 0, "description": "EOS and stop_token_ids are ignored before this many tokens; at most max_tokens (vLLM extension)"},
          "ignore_eos": {"type": "boolean", "nullable": true, "default": false, "description": "Keep generating past EOS (vLLM extension)"},
          "include_stop_str_in_output": {"type": "boolean", "nullable": true, "default": false, "description": "vLLM extension"},
          "skip_special_tokens": {"type": "boolean", "nullable": true, "default": true, "description": "vLLM extension"},
          "stop": {"$ref": "#/components/schemas/StopField"},
          "stop_token_ids": {"type": "array", "nullable": true, "maxItems": 1024, "items": {"type": "integer", "minimum": 0, "maximum": 2147483647}, "description": "Generation stops when one of these token ids is sampled (vLLM extension)"},
          "stream": {"type": "boolean", "nullable": true, "default": false},
          "stream_options": {"$ref": "#/components/schemas/StreamOptions"},
          "logit_bias": {"type": "object", "nullable": true, "maxProperties": 1024, "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}, "description": "Token id (as a decimal string, below the vocabulary size) -> bias added to its logit before sampling; -100 bans, +100 all but forces"},
          "response_format": {"$ref": "#/components/schemas/ResponseFormat"},
          "guided_json": {"nullable": true, "anyOf": [{"type": "object"}, {"type": "string"}], "description": "vLLM extension: the output follows this JSON Schema (an object, or its JSON text)"},
          "guided_regex": {"type": "string", "nullable": true, "description": "vLLM extension: the output matches this regular expression"},
          "guided_choice": {"type": "array", "nullable": true, "minItems": 1, "maxItems": 1024, "items": {"type": "string"}, "description": "vLLM extension: the output is one of these strings"},
          "guided_grammar": {"type": "string", "nullable": true, "description": "vLLM extension: the output follows this GBNF grammar (llama.cpp notation, start rule root)"},
          "structured_outputs": {
            "type": "object",
            "nullable": true,
            "description": "vLLM extension: the same constraints as guided_json / guided_regex / guided_choice / guided_grammar; at most one constraint per request in all",
            "properties": {
              "json": {"nullable": true, "anyOf": [{"type": "object"}, {"type": "string"}]},
              "regex": {"type": "string", "nullable": true},
              "choice": {"type": "array", "nullable": true, "minItems": 1, "items": {"type": "string"}},
              "grammar": {"type": "string", "nullable": true}
            }
          },
          "user": {"type": "string", "nullable": true, "description": "Accepted and ignored"}
        }
      },
      "ResponseFormat": {
        "type": "object",
        "nullable": true,
        "required": ["type"],
        "description": "text: free text; json_object: any JSON object; json_schema: JSON that follows json_schema.schema (OpenAI's structured-outputs subset; an unsupported keyword is a 400 naming it). Constrained output ends by itself (finish_reason stop) once the document is complete.",
        "properties": {
          "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
          "json_schema": {
            "type": "object",
            "required": ["schema"],
            "properties": {
              "name": {"type": "string"},
              "description": {"type": "string"},
              "schema": {"type": "object"},
              "strict": {"type": "boolean", "nullable": true}
            }
          }
        }
      },
      "TokenIds": {
        "type": "array",
        "minItems": 1,
        "items": {"type": "integer", "minimum": 0, "maximum": 2147483647},
        "description": "Token ids, each below the model's vocabulary size"
      },
      "CompletionRequest": {
        "allOf": [
          {"$ref": "#/components/schemas/SamplingFields"},
          {
            "type": "object",
            "required": ["prompt"],
            "properties": {
              "prompt": {
                "description": "A string, up to 64 strings (a batch), token ids, or up to 64 lists of token ids. Prompts must not be empty.",
                "anyOf": [
                  {"type": "string", "minLength": 1},
                  {"type": "array", "minItems": 1, "maxItems": 64, "items": {"type": "string", "minLength": 1}},
                  {"$ref": "#/components/schemas/TokenIds"},
                  {"type": "array", "minItems": 1, "maxItems": 64, "items": {"$ref": "#/components/schemas/TokenIds"}}
                ]
              },
              "max_tokens": {"type": "integer", "nullable": true, "minimum": 1, "maximum": 2147483647, "default": 16, "description": "Prompt tokens + max_tokens must not exceed max_model_len"},
              "echo": {"type": "boolean", "nullable": true, "default": false, "description": "Prepend the prompt to the output; not together with logprobs"},
              "suffix": {"type": "string", "nullable": true, "maxLength": 0, "description": "Not supported: only an empty string is accepted"},
              "logprobs": {"type": "integer", "nullable": true, "minimum": 0, "maximum": 20, "description": "Return the log-probability of each output token and of this many most likely alternatives"}
            }
          }
        ]
      },
      "TextContentPart": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {
          "type": {"type": "string", "enum": ["text"]},
          "text": {"type": "string"}
        }
      },
      "ChatMessage": {
        "type": "object",
        "required": ["role"],
        "description": "Passed to the chat template as it is, except that `content` is flattened to a string (text parts joined by newlines; null or absent is \"\", but stays null in an assistant message with `tool_calls` when the template knows `tool_calls`). An assistant message's `tool_calls` reach the template with their arguments as JSON objects (as JSON text for templates that concatenate it, DeepSeek's); a `tool` message carries a tool's result.",
        "properties": {
          "role": {"type": "string", "description": "system, user, assistant, tool, ... as the model's chat template knows them"},
          "content": {
            "anyOf": [
              {"type": "string"},
              {"type": "array", "items": {"$ref": "#/components/schemas/TextContentPart"}},
              {"$ref": "#/components/schemas/Null"}
            ]
          },
          "name": {"type": "string", "nullable": true},
          "tool_calls": {"type": "array", "nullable": true, "maxItems": 128, "items": {"$ref": "#/components/schemas/ToolCallIn"}, "description": "assistant messages: the calls the model made"},
          "tool_call_id": {"type": "string", "nullable": true, "description": "tool messages: the call this is the result of"}
        }
      },
      "ToolCallIn": {
        "type": "object",
        "required": ["function"],
        "properties": {
          "id": {"type": "string", "nullable": true},
          "type": {"type": "string", "nullable": true, "enum": ["function", null]},
          "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {
              "name": {"type": "string"},
              "arguments": {"anyOf": [{"type": "string"}, {"type": "object"}], "description": "JSON text of an object (an object is accepted too); invalid JSON is a 400"}
            }
          }
        }
      },
      "Tool": {
        "type": "object",
        "required": ["type", "function"],
        "properties": {
          "type": {"type": "string", "enum": ["function"]},
          "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
              "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$", "description": "Unique among the tools"},
              "description": {"type": "string", "nullable": true},
              "parameters": {"type": "object", "nullable": true, "description": "JSON Schema of the arguments (type object). With a forced tool_choice it must use the JSON Schema subset of response_format json_schema (else a 400 naming the keyword)."},
              "strict": {"type": "boolean", "nullable": true}
            }
          }
        }
      },
      "ToolChoice": {
        "description": "none: no tool calls are parsed (the tools still reach the template, like vLLM); auto (the default with tools): the output is parsed for calls; required: one or more calls are forced by grammar (one with parallel_tool_calls false); a named function: calls of that function are forced. required and a named function need tools and exclude response_format json_object / json_schema and the guided_* constraints.",
        "anyOf": [
          {"type": "string", "enum": ["none", "auto", "required"]},
          {
            "type": "object",
            "required": ["type", "function"],
            "properties": {
              "type": {"type": "string", "enum": ["function"]},
              "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "description": "One of the tools"}}}
            }
          },
          {"$ref": "#/components/schemas/Null"}
        ]
      },
      "ToolCallOut": {
        "type": "object",
        "required": ["id", "type", "function"],
        "properties": {
          "id": {"type": "string", "pattern": "^call_[A-Za-z0-9]{24}$"},
          "type": {"type": "string", "enum": ["function"]},
          "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {
              "name": {"type": "string"},
              "arguments": {"type": "string", "description": "Compact JSON text of an object"}
            }
          }
        }
      },
      "ToolCallDelta": {
        "description": "A complete call in one delta (calls are streamed once they are complete): a ToolCallOut plus its index",
        "allOf": [
          {"$ref": "#/components/schemas/ToolCallOut"},
          {
            "type": "object",
            "required": ["index"],
            "properties": {"index": {"type": "integer", "minimum": 0, "description": "The call's position among the choice's calls"}}
          }
        ]
      },
      "ChatCompletionRequest": {
        "allOf": [
          {"$ref": "#/components/schemas/SamplingFields"},
          {
            "type": "object",
            "required": ["messages"],
            "properties": {
              "messages": {"type": "array", "minItems": 1, "maxItems": 4096, "items": {"$ref": "#/components/schemas/ChatMessage"}},
              "max_tokens": {"type": "integer", "nullable": true, "minimum": 1, "maximum": 2147483647, "description": "Default: the rest of the context (max_model_len minus the prompt)"},
              "max_completion_tokens": {"type": "integer", "nullable": true, "minimum": 1, "maximum": 2147483647, "description": "The same as max_tokens; wins when both are given"},
              "logprobs": {"type": "boolean", "nullable": true, "default": false, "description": "Return the log-probability of each output token"},
              "top_logprobs": {"type": "integer", "nullable": true, "minimum": 0, "maximum": 20, "description": "Most likely alternatives per token; above 0 requires logprobs true"},
              "add_generation_prompt": {"type": "boolean", "nullable": true, "default": true},
              "continue_final_message": {"type": "boolean", "nullable": true, "enum": [false, null], "description": "Not supported: only false is accepted"},
              "chat_template_kwargs": {"type": "object", "nullable": true, "description": "Extra variables for the chat template"},
              "tools": {"type": "array", "nullable": true, "maxItems": 128, "items": {"$ref": "#/components/schemas/Tool"}, "description": "Function tools, passed to the chat template; the model's calls come back in message.tool_calls (delta.tool_calls when streaming), parsed in the model family's syntax (peng serve --tool-call-parser). An empty list is the same as none."},
              "tool_choice": {"$ref": "#/components/schemas/ToolChoice"},
              "parallel_tool_calls": {"type": "boolean", "nullable": true, "default": true, "description": "With a forced tool_choice: whether more than one call may be made"}
            }
          }
        ]
      },
      "Usage": {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
          "prompt_tokens": {"type": "integer", "minimum": 0},
          "completion_tokens": {"type": "integer", "minimum": 0},
          "total_tokens": {"type": "integer", "minimum": 0}
        }
      },
      "FinishReason": {
        "type": "string",
        "enum": ["stop", "length", "abort", "error", "tool_calls"],
        "description": "stop: EOS, a stop string or a stop token; tool_calls: like stop, and the output held tool calls (chat with tools); length: max_tokens or the context is full; abort: the server stopped the request (shutdown); error: the generation failed (streams only)"
      },
      "CompletionLogprobs": {
        "type": "object",
        "required": ["text_offset", "token_logprobs", "tokens", "top_logprobs"],
        "description": "-inf log-probabilities are written as -9999",
        "properties": {
          "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0}},
          "token_logprobs": {"type": "array", "items": {"type": "number"}},
          "tokens": {"type": "array", "items": {"type": "string"}},
          "top_logprobs": {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "number"}}}
        }
      },
      "ChatTopLogprob": {
        "type": "object",
        "required": ["token", "logprob", "bytes"],
        "properties": {
          "token": {"type": "string"},
          "logprob": {"type": "number"},
          "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}
        }
      },
      "ChatTokenLogprob": {
        "type": "object",
        "required": ["token", "logprob", "bytes", "top_logprobs"],
        "properties": {
          "token": {"type": "string", "description": "The text this token added to the output"},
          "logprob": {"type": "number"},
          "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}, "description": "The token's own bytes"},
          "top_logprobs": {"type": "array", "items": {"$ref": "#/components/schemas/ChatTopLogprob"}}
        }
      },
      "ChatLogprobs": {
        "type": "object",
        "required": ["content"],
        "properties": {"content": {"type": "array", "items": {"$ref": "#/components/schemas/ChatTokenLogprob"}}}
      },
      "CompletionChoice": {
        "type": "object",
        "required": ["index", "text", "logprobs", "finish_reason"],
        "properties": {
          "index": {"type": "integer", "minimum": 0},
          "text": {"type": "string"},
          "logprobs": {"anyOf": [{"$ref": "#/components/schemas/CompletionLogprobs"}, {"$ref": "#/components/schemas/Null"}]},
          "finish_reason": {"$ref": "#/components/schemas/FinishReason"}
        }
      },
      "CompletionResponse": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
          "id": {"type": "string", "pattern": "^cmpl-[0-9a-f]{32}$"},
          "object": {"type": "string", "enum": ["text_completion"]},
          "created": {"type": "integer", "description": "Unix seconds"},
          "model": {"type": "string"},
          "choices": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/CompletionChoice"}, "description": "Prompt p, sample k is choice p * n + k"},
          "usage": {"$ref": "#/components/schemas/Usage"}
        }
      },
      "ChatMessageOut": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
          "role": {"type": "string", "enum": ["assistant"]},
          "content": {"type": "string", "nullable": true, "description": "null when the output held tool calls and nothing else"},
          "tool_calls": {"type": "array", "items": {"$ref": "#/components/schemas/ToolCallOut"}, "description": "Present when the output held tool calls"}
        }
      },
      "ChatCompletionChoice": {
        "type": "object",
        "required": ["index", "message", "logprobs", "finish_reason"],
        "properties": {
          "index": {"type": "integer", "minimum": 0},
          "message": {"$ref": "#/components/schemas/ChatMessageOut"},
          "logprobs": {"anyOf": [{"$ref": "#/components/schemas/ChatLogprobs"}, {"$ref": "#/components/schemas/Null"}]},
          "finish_reason": {"$ref": "#/components/schemas/FinishReason"}
        }
      },
      "ChatCompletionResponse": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
          "id": {"type": "string", "pattern": "^chatcmpl-[0-9a-f]{32}$"},
          "object": {"type": "string", "enum": ["chat.completion"]},
          "created": {"type": "integer", "description": "Unix seconds"},
          "model": {"type": "string"},
          "choices": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ChatCompletionChoice"}},
          "usage": {"$ref": "#/components/schemas/Usage"}
        }
      },
      "CompletionChunk": {
        "type": "object",
        "description": "One event of a streamed completion. `usage` is present (null) on every chunk when include_usage is set, and carries the usage so far with continuous_usage_stats.",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
          "id": {"type": "string", "pattern": "^cmpl-[0-9a-f]{32}$"},
          "object": {"type": "string", "enum": ["text_completion"]},
          "created": {"type": "integer"},
          "model": {"type": "string"},
          "choices": {
            "type": "array",
            "maxItems": 1,
            "items": {
              "type": "object",
              "required": ["index", "text", "logprobs", "finish_reason"],
              "properties": {
                "index": {"type": "integer", "minimum": 0},
                "text": {"type": "string"},
                "logprobs": {"anyOf": [{"$ref": "#/components/schemas/CompletionLogprobs"}, {"$ref": "#/components/schemas/Null"}]},
                "finish_reason": {"anyOf": [{"$ref": "#/components/schemas/FinishReason"}, {"$ref": "#/components/schemas/Null"}]}
              }
            }
          },
          "usage": {"anyOf": [{"$ref": "#/components/schemas/Usage"}, {"$ref": "#/components/schemas/Null"}]}
        }
      },
      "ChatCompletionChunk": {
        "type": "object",
        "description": "One event of a streamed chat completion. `usage` is present (null) on every chunk when include_usage is set, and carries the usage so far with continuous_usage_stats.",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
          "id": {"type": "string", "pattern": "^chatcmpl-[0-9a-f]{32}$"},
          "object": {"type": "string", "enum": ["chat.completion.chunk"]},
          "created": {"type": "integer"},
          "model": {"type": "string"},
          "choices": {
            "type": "array",
            "maxItems": 1,
            "items": {
              "type": "object",
              "required": ["index", "delta", "logprobs", "finish_reason"],
              "properties": {
                "index": {"type": "integer", "minimum": 0},
                "delta": {
                  "type": "object",
                  "properties": {
                    "role": {"type": "string", "enum": ["assistant"]},
                    "content": {"type": "string"},
                    "tool_calls": {"type": "array", "items": {"$ref": "#/components/schemas/ToolCallDelta"}}
                  }
                },
                "logprobs": {"anyOf": [{"$ref": "#/components/schemas/ChatLogprobs"}, {"$ref": "#/components/schemas/Null"}]},
                "finish_reason": {"anyOf": [{"$ref": "#/components/schemas/FinishReason"}, {"$ref": "#/components/schemas/Null"}]}
              }
            }
          },
          "usage": {"anyOf": [{"$ref": "#/components/schemas/Usage"}, {"$ref": "#/components/schemas/Null"}]}
        }
      },
      "CompletionChunkEvent": {
        "type": "object",
        "description": "One Server-Sent Event of the stream (OpenAPI 3.0 has no way to describe the JSON inside `data`): a CompletionChunk, the Error object of a failed generation (`{\"error\": {...}}`), or `[DONE]` as the last event.",
        "required": ["data"],
        "properties": {
          "data": {"type": "string", "pattern": "^(\\{.*\\}|\\[DONE\\])$"},
          "event": {"type": "string", "enum": ["message"], "description": "The default event type: the server sends no `event:` field"}
        }
      },
      "ChatCompletionChunkEvent": {
        "type": "object",
        "description": "One Server-Sent Event of the stream (OpenAPI 3.0 has no way to describe the JSON inside `data`): a ChatCompletionChunk, the Error object of a failed generation (`{\"error\": {...}}`), or `[DONE]` as the last event.",
        "required": ["data"],
        "properties": {
          "data": {"type": "string", "pattern": "^(\\{.*\\}|\\[DONE\\])$"},
          "event": {"type": "string", "enum": ["message"], "description": "The default event type: the server sends no `event:` field"}
        }
      },
      "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by", "root", "parent", "max_model_len"],
        "properties": {
          "id": {"type": "string", "description": "The served model name (--served-model-name)"},
          "object": {"type": "string", "enum": ["model"]},
          "created": {"type": "integer", "description": "Unix seconds when the server started"},
          "owned_by": {"type": "string", "enum": ["peng"]},
          "root": {"type": "string", "description": "The model's own name"},
          "parent": {"type": "string", "nullable": true, "enum": [null]},
          "max_model_len": {"type": "integer", "minimum": 1, "description": "Prompt + output tokens per sequence"}
        }
      },
      "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
          "object": {"type": "string", "enum": ["list"]},
          "data": {"type": "array", "minItems": 1, "maxItems": 1, "items": {"$ref": "#/components/schemas/Model"}}
        }
      }
    }
  }
})json";
  return kSpec;
}

}  // namespace peng::server
