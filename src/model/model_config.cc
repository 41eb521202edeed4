#include "model/model_config.h"

#include <cmath>
#include <sstream>

namespace peng {

float ModelConfig::AttentionScale() const {
  return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::string ModelConfig::Summary() const {
  std::ostringstream s;
  s << arch << " '" << name << "': layers=" << n_layers << " hidden=" << hidden_size
    << " heads=" << n_heads << "/" << n_kv_heads << " head_dim=" << head_dim
    << " ffn=" << ffn_dim << " vocab=" << vocab_size << " ctx=" << max_position
    << " rope_theta=" << rope.theta;
  if (sliding_window > 0) s << " sliding_window=" << sliding_window;
  return s.str();
}

}  // namespace peng
