// The ranks' liveness (liveness.hpp): the first line of an error, and the host-side wait
// on a collective that checks the peers' heartbeat and dist_timeout while it naps.
#include "liveness.hpp"

#include <algorithm>
#include <thread>

namespace medfast::dist::detail {

std::string cause(const std::exception& e) {
  std::string m = message_of(e);
  const auto nl = m.find('\n');
  if (nl != std::string::npos) m.resize(nl);
  while (!m.empty() && (m.back() == ' ' || m.back() == '\r')) m.pop_back();
  return m;
}

void wait_until_complete(const CollectiveWait& w) {
  constexpr auto kCheckPeers = std::chrono::milliseconds(500);
  constexpr auto kLongestNap = std::chrono::microseconds(1000);
  const auto start = Clock::now();
  auto next_check = start + kCheckPeers;
  auto nap = std::chrono::microseconds(20);
  while (!w.completed()) {
    const auto now = Clock::now();
    std::string why;
    if (w.dead_peers && now >= next_check) {
      why = w.dead_peers();
      next_check = now + kCheckPeers;
    }
    if (why.empty() && w.timeout.count() > 0 && now - start >= w.timeout) {
      why = str("it did not complete within ", std::chrono::duration<double>(w.timeout).count(),
                " s (dist_timeout), and every peer still beats: one of them may be stuck outside this collective");
    }
    if (!why.empty()) {
      if (w.abort) {
        try {
          w.abort();
        } catch (const std::exception& e) {
          why += str("; aborting the collective failed too: ", cause(e));
        }
      }
      throw CollectiveAbandoned(w.what.empty() ? why : str(w.what, ": ", why));
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, kLongestNap);
  }
}

}  // namespace medfast::dist::detail
