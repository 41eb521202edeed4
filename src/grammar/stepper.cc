// Stack-set stepping (grammar_internal.h): frame interning, closure of a position (calls
// pushed, finished rules popped, until every stack tops a byte set or is done), one byte step,
// and the canonical form of a stack set.
#include <algorithm>

#include "grammar/grammar_internal.h"

namespace peng::grammar {

namespace {
inline size_t Mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return size_t(k);
}
}  // namespace

int32_t& U64Map::FindOrInsert(uint64_t key, int32_t fresh, bool* inserted) {
  if ((size_ + 1) * 2 > slots_.size()) Grow();
  size_t mask = slots_.size() - 1;
  for (size_t i = Mix(key) & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.gen != gen_) {
      s = {key, fresh, gen_};
      ++size_;
      *inserted = true;
      return s.value;
    }
    if (s.key == key) {
      *inserted = false;
      return s.value;
    }
  }
}

void U64Map::Grow() {
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(std::max<size_t>(64, old.size() * 2), Slot{0, 0, 0});
  uint32_t old_gen = gen_;
  gen_ = 1;
  size_ = 0;
  for (const Slot& s : old) {
    if (s.gen != old_gen) continue;
    bool ins;
    FindOrInsert(s.key, s.value, &ins);
  }
}

void U64Map::Clear() {
  size_ = 0;
  if (++gen_ == 0) {  // stamps wrapped: really clear
    for (Slot& s : slots_) s.gen = 0;
    gen_ = 1;
  }
}

int32_t FrameTable::Intern(int32_t ret, int32_t parent) {
  bool inserted;
  int32_t id = index_.FindOrInsert(MakeTop(ret, parent), int32_t(frames_.size()), &inserted);
  if (inserted) frames_.push_back({ret, parent});
  return id;
}

void FrameTable::Clear() {
  frames_.clear();
  index_.Clear();
}

bool Stepper::Expand(int32_t pos, int32_t frame, std::vector<Top>* out) {
  out->clear();
  seen_.Clear();
  if (!Closure(pos, frame, out)) {
    out->clear();
    return false;
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return true;
}

bool Stepper::Closure(int32_t pos, int32_t frame, std::vector<Top>* out) {
  work_.clear();
  work_.push_back({pos, frame});
  while (!work_.empty()) {
    auto [p, f] = work_.back();
    work_.pop_back();
    bool fresh;
    seen_.FindOrInsert(MakeTop(p, f), 0, &fresh);
    if (!fresh) continue;
    const Elem& e = g_.elems[p];
    switch (e.kind) {
      case ElemKind::kBytes:
        out->push_back(MakeTop(p, f));
        if (out->size() > kMaxStacks) return false;
        break;
      case ElemKind::kEnd:
        if (f < 0) {
          out->push_back(kAcceptTop);
        } else if (frames_[f].first == kUnknownRet) {
          out->push_back(kContextTop);
        } else {
          work_.push_back(frames_[f]);
        }
        break;
      case ElemKind::kRef: {
        // A call in tail position pushes no frame.
        int32_t nf = g_.elems[p + 1].kind == ElemKind::kEnd ? f : frames_.Intern(p + 1, f);
        const auto& alts = g_.rules[e.arg].alts;
        for (auto it = alts.rbegin(); it != alts.rend(); ++it) work_.push_back({*it, nf});
        if (seen_.size() > 16 * kMaxStacks) return false;
        break;
      }
    }
  }
  return true;
}

bool Stepper::Start(int32_t rule, std::vector<Top>* out) {
  out->clear();
  seen_.Clear();
  for (int32_t a : g_.rules[rule].alts) {
    if (!Closure(a, -1, out)) {
      out->clear();
      return false;
    }
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return true;
}

bool Stepper::Step(const std::vector<Top>& in, uint8_t b, std::vector<Top>* out) {
  out->clear();
  for (Top t : in) {
    if (t >= kContextTop) continue;
    int32_t p = TopPos(t);
    if (!HasByte(g_.byte_sets[g_.elems[p].arg], b)) continue;
    int32_t q = p + 1;
    int32_t f = TopFrame(t);
    if (g_.elems[q].kind == ElemKind::kBytes) {
      out->push_back(MakeTop(q, f));
      continue;
    }
    bool fresh;
    int32_t idx = memo_index_.FindOrInsert(MakeTop(q, f), int32_t(memo_ranges_.size()), &fresh);
    if (fresh) {
      tmp_.clear();
      seen_.Clear();
      if (!Closure(q, f, &tmp_)) {
        // Not memoized: a later lookup recomputes and fails the same way.
        memo_index_.FindOrInsert(MakeTop(q, f), -1, &fresh) = -1;
        out->clear();
        return false;
      }
      memo_ranges_.push_back({uint32_t(memo_tops_.size()), uint32_t(tmp_.size())});
      memo_tops_.insert(memo_tops_.end(), tmp_.begin(), tmp_.end());
    } else if (idx < 0) {
      out->clear();
      return false;
    }
    auto [begin, count] = memo_ranges_[idx];
    out->insert(out->end(), memo_tops_.begin() + begin, memo_tops_.begin() + begin + count);
  }
  if (out->size() > 1) {
    std::sort(out->begin(), out->end());
    out->erase(std::unique(out->begin(), out->end()), out->end());
    if (out->size() > kMaxStacks) {
      out->clear();
      return false;
    }
  }
  return true;
}

namespace {
std::vector<std::vector<int32_t>> Stacks(const std::vector<Top>& tops, const FrameTable& frames) {
  std::vector<std::vector<int32_t>> stacks;
  stacks.reserve(tops.size());
  for (Top t : tops) {
    std::vector<int32_t> s;
    if (t == kAcceptTop) {
      s.push_back(-2);
    } else {
      s.push_back(TopPos(t));
      for (int32_t f = TopFrame(t); f >= 0; f = frames[f].second) s.push_back(frames[f].first);
    }
    stacks.push_back(std::move(s));
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  return stacks;
}
}  // namespace

std::vector<int32_t> CanonicalKey(const std::vector<Top>& tops, const FrameTable& frames) {
  std::vector<int32_t> key;
  for (const auto& s : Stacks(tops, frames)) {
    key.insert(key.end(), s.begin(), s.end());
    key.push_back(-1);
  }
  return key;
}

void Compact(std::vector<Top>* tops, FrameTable* frames) {
  auto stacks = Stacks(*tops, *frames);
  frames->Clear();
  tops->clear();
  for (const auto& s : stacks) {
    if (s[0] == -2) {
      tops->push_back(kAcceptTop);
      continue;
    }
    int32_t f = -1;
    for (size_t i = s.size(); i-- > 1;) f = frames->Intern(s[i], f);
    tops->push_back(MakeTop(s[0], f));
  }
  std::sort(tops->begin(), tops->end());
}

}  // namespace peng::grammar
