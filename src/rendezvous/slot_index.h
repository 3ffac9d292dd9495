// SlotIndex: the connection listed for each slot with its JOIN (the
// server's waiting joins, or the members of the current generation), and the
// list of those joins in slot order that snapshot() hands out.
//
// The list is shared with the snapshots (a snapshot costs a reference
// count). It is patched in place with the slots that changed since it was
// built: from the first changed position on, a lookup per changed slot;
// joins that come in slot order touch only its end. It is copied first only
// when a snapshot still holds it, and rebuilt from the whole index only after
// clear() or when most of it changed. So rebuilding a list touches the index
// alone, never 100,000 connections. Not thread-safe.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "rendezvous/membership.h"
#include "rendezvous/outbox.h"

namespace erun {

class SlotIndex {
 public:
  struct Entry {
    ConnId conn = 0;
    JoinRequest join;
  };
  using Map = std::map<SlotKey, Entry>;

  // Lists `conn` for `join.slot`, in place of whichever was listed.
  void put(ConnId conn, const JoinRequest& join);
  // Takes `slot` out if `conn` is the connection listed for it.
  void remove(const SlotKey& slot, ConnId conn);
  void clear();
  // The entry of `slot`, or nullptr.
  const Entry* find(const SlotKey& slot) const;
  Map::const_iterator begin() const { return index_.begin(); }
  Map::const_iterator end() const { return index_.end(); }
  size_t size() const { return index_.size(); }

  // The listed joins in slot order, brought up to date.
  std::shared_ptr<const std::vector<JoinRequest>> list();

 private:
  void touch(const SlotKey& slot);
  void patch();

  Map index_;
  std::shared_ptr<std::vector<JoinRequest>> list_ = std::make_shared<std::vector<JoinRequest>>();
  bool dirty_ = true;            // rebuild `list_` from the whole index
  std::vector<SlotKey> touched_;  // slots put or taken out since `list_` was built
};

}  // namespace erun
