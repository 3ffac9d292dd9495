#include "rendezvous/slot_index.h"

#include <algorithm>
#include <iterator>

namespace erun {

void SlotIndex::put(ConnId conn, const JoinRequest& join) {
  index_[join.slot] = Entry{conn, join};
  touch(join.slot);
}

void SlotIndex::remove(const SlotKey& slot, ConnId conn) {
  auto it = index_.find(slot);
  if (it == index_.end() || it->second.conn != conn) return;
  index_.erase(it);
  touch(slot);
}

void SlotIndex::clear() {
  index_.clear();
  dirty_ = true;
}

const SlotIndex::Entry* SlotIndex::find(const SlotKey& slot) const {
  auto it = index_.find(slot);
  return it == index_.end() ? nullptr : &it->second;
}

void SlotIndex::touch(const SlotKey& slot) {
  if (dirty_) return;
  // A driver that stops asking (restart mode) does not grow this forever.
  if (touched_.size() >= std::max<size_t>(1024, list_->size())) {
    dirty_ = true;
    std::vector<SlotKey>().swap(touched_);
    return;
  }
  touched_.push_back(slot);
}

std::shared_ptr<const std::vector<JoinRequest>> SlotIndex::list() {
  if (dirty_) {
    auto fresh = std::make_shared<std::vector<JoinRequest>>();
    fresh->reserve(index_.size());
    for (auto& [slot, entry] : index_) fresh->push_back(entry.join);
    list_ = std::move(fresh);
    dirty_ = false;
    touched_.clear();
  } else if (!touched_.empty()) {
    patch();
  }
  return list_;
}

// Everything before the first touched slot stays where it is; the rest is
// rebuilt: untouched runs moved, each touched slot's old entry dropped and
// its current one (if any) put in its place.
void SlotIndex::patch() {
  if (list_.use_count() > 1) list_ = std::make_shared<std::vector<JoinRequest>>(*list_);
  std::vector<JoinRequest>& list = *list_;
  auto& t = touched_;
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  auto by_slot = [](const JoinRequest& j, const SlotKey& s) { return j.slot < s; };
  auto from = std::lower_bound(list.begin(), list.end(), t.front(), by_slot);
  const size_t keep = static_cast<size_t>(from - list.begin());
  std::vector<JoinRequest> tail;
  tail.reserve(list.size() - keep + t.size());
  for (const SlotKey& slot : t) {
    auto pos = std::lower_bound(from, list.end(), slot, by_slot);
    tail.insert(tail.end(), std::make_move_iterator(from), std::make_move_iterator(pos));
    from = pos;
    if (from != list.end() && from->slot == slot) ++from;
    if (auto it = index_.find(slot); it != index_.end()) tail.push_back(it->second.join);
  }
  tail.insert(tail.end(), std::make_move_iterator(from), std::make_move_iterator(list.end()));
  list.resize(keep);
  list.insert(list.end(), std::make_move_iterator(tail.begin()), std::make_move_iterator(tail.end()));
  t.clear();
}

}  // namespace erun
