//! Which session serves the next visitor of a service: the set of sessions serving one
//! service and the balancing strategies over it, as a clock-free, socket-free state machine.
//!
//! A service is served by a **set** of sessions (several clients, or one client through
//! several servers), never "the newest one". The server keeps one [`ServingSet`] per service:
//! a session joins when its hello is accepted, leaves the moment it ends, and is withdrawn
//! (kept, but never picked) while its client reports the service's target unhealthy. Each
//! visitor gets one [`ServingSet::pick`]; a pick that failed before any byte went back to
//! the visitor is retried with the sessions already tried excluded, so a visitor is reset
//! only when every session has failed it.
//!
//! The sets are small (a session per client per server), so members live in a `Vec` and a
//! pick is a linear scan: no allocation, no hashing on the visitor path.

/// How a service spreads its visitors over the sessions serving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// The member with the fewest open streams relative to its weight; ties go round-robin
    /// (so sequential short connections spread evenly too).
    #[default]
    LeastConnections,
    /// Smooth weighted round-robin (nginx's): over any window, each member gets its
    /// weight's share, interleaved rather than in bursts.
    RoundRobin,
    /// A weighted random member (randomness from the caller).
    Random,
}

impl Strategy {
    /// The name used in config files.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::LeastConnections => "least-connections",
            Strategy::RoundRobin => "round-robin",
            Strategy::Random => "random",
        }
    }

    /// Parses a config name.
    pub fn from_name(name: &str) -> Option<Strategy> {
        match name {
            "least-connections" => Some(Strategy::LeastConnections),
            "round-robin" => Some(Strategy::RoundRobin),
            "random" => Some(Strategy::Random),
            _ => None,
        }
    }
}

/// Largest weight a member may have; larger ones are clamped (keeps the arithmetic in u64).
pub const MAX_WEIGHT: u32 = 10_000;

/// One session serving the service.
#[derive(Debug, Clone)]
pub struct Member<K, T> {
    /// The member's key (the session id).
    pub key: K,
    /// What the caller keeps with it (the session).
    pub value: T,
    /// Relative share of visitors, at least 1.
    pub weight: u32,
    /// `false` while the client reports the service's target unhealthy: never picked.
    pub ready: bool,
    /// Streams picked and not yet released.
    pub open: u32,
    /// Streams picked in all.
    pub picked: u64,
    /// Smooth weighted round-robin state.
    current: i64,
}

/// The sessions serving one service.
#[derive(Debug, Clone)]
pub struct ServingSet<K, T> {
    strategy: Strategy,
    members: Vec<Member<K, T>>,
    /// Where the next round-robin tie-break starts.
    cursor: usize,
}

impl<K: Copy + Eq, T> Default for ServingSet<K, T> {
    fn default() -> Self {
        ServingSet::new(Strategy::default())
    }
}

impl<K: Copy + Eq, T> ServingSet<K, T> {
    /// An empty set balancing with `strategy`.
    pub fn new(strategy: Strategy) -> Self {
        ServingSet {
            strategy,
            members: Vec::new(),
            cursor: 0,
        }
    }

    /// The strategy in force.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Changes the strategy (a reload); members and their open streams stay.
    pub fn set_strategy(&mut self, strategy: Strategy) {
        self.strategy = strategy;
    }

    /// Adds a member, or updates its weight and readiness if `key` is already in (its
    /// open-stream count is kept).
    pub fn insert(&mut self, key: K, value: T, weight: u32, ready: bool) {
        let weight = weight.clamp(1, MAX_WEIGHT);
        if let Some(member) = self.members.iter_mut().find(|m| m.key == key) {
            member.value = value;
            member.weight = weight;
            member.ready = ready;
            return;
        }
        self.members.push(Member {
            key,
            value,
            weight,
            ready,
            open: 0,
            picked: 0,
            current: 0,
        });
    }

    /// Removes a member; `None` if it was not in.
    pub fn remove(&mut self, key: K) -> Option<T> {
        let index = self.members.iter().position(|m| m.key == key)?;
        let member = self.members.remove(index);
        if self.cursor > index {
            self.cursor -= 1;
        }
        Some(member.value)
    }

    /// Marks a member ready (picked again) or withdrawn; `false` if it is not in.
    pub fn set_ready(&mut self, key: K, ready: bool) -> bool {
        match self.members.iter_mut().find(|m| m.key == key) {
            Some(member) => {
                member.ready = ready;
                true
            }
            None => false,
        }
    }

    /// Picks the member for the next stream among the ready ones not in `exclude`, counts
    /// the stream as open on it, and returns it. `random` is only read by
    /// [`Strategy::Random`]. `None` when no member qualifies.
    pub fn pick(&mut self, exclude: &[K], random: u64) -> Option<&Member<K, T>> {
        self.pick_if(exclude, random, |_| true)
    }

    /// [`ServingSet::pick`] among the members whose value `accept` takes (a session whose
    /// peer answers, say).
    pub fn pick_if(
        &mut self,
        exclude: &[K],
        random: u64,
        accept: impl Fn(&T) -> bool,
    ) -> Option<&Member<K, T>> {
        let eligible = |m: &Member<K, T>| m.ready && !exclude.contains(&m.key) && accept(&m.value);
        let index = match self.strategy {
            Strategy::LeastConnections => self.pick_least(eligible),
            Strategy::RoundRobin => self.pick_round_robin(eligible),
            Strategy::Random => self.pick_random(eligible, random),
        }?;
        let member = &mut self.members[index];
        member.open = member.open.saturating_add(1);
        member.picked = member.picked.saturating_add(1);
        Some(&self.members[index])
    }

    /// Ends a stream picked on `key` (a member that left meanwhile is ignored).
    pub fn release(&mut self, key: K) {
        if let Some(member) = self.members.iter_mut().find(|m| m.key == key) {
            member.open = member.open.saturating_sub(1);
        }
    }

    /// The members, in the order they joined.
    pub fn members(&self) -> &[Member<K, T>] {
        &self.members
    }

    /// Members in the set (ready or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether no session serves the service.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members that would be picked now.
    pub fn ready_len(&self) -> usize {
        self.members.iter().filter(|m| m.ready).count()
    }

    /// Fewest open streams per unit of weight; ties broken round-robin from the cursor.
    fn pick_least(&mut self, eligible: impl Fn(&Member<K, T>) -> bool) -> Option<usize> {
        let n = self.members.len();
        let mut best: Option<usize> = None;
        for step in 0..n {
            let index = (self.cursor + step) % n;
            let member = &self.members[index];
            if !eligible(member) {
                continue;
            }
            // open_a / weight_a < open_b / weight_b, without division.
            let better = best.is_none_or(|b| {
                let other = &self.members[b];
                u64::from(member.open) * u64::from(other.weight)
                    < u64::from(other.open) * u64::from(member.weight)
            });
            if better {
                best = Some(index);
            }
        }
        let index = best?;
        self.cursor = (index + 1) % n;
        Some(index)
    }

    /// Smooth weighted round-robin over the eligible members.
    fn pick_round_robin(&mut self, eligible: impl Fn(&Member<K, T>) -> bool) -> Option<usize> {
        let mut total = 0i64;
        let mut best: Option<(usize, i64)> = None;
        for (index, member) in self.members.iter_mut().enumerate() {
            if !eligible(member) {
                continue;
            }
            member.current += i64::from(member.weight);
            total += i64::from(member.weight);
            if best.is_none_or(|(_, current)| member.current > current) {
                best = Some((index, member.current));
            }
        }
        let (index, _) = best?;
        self.members[index].current -= total;
        Some(index)
    }

    /// A random eligible member, each with probability weight / total weight.
    fn pick_random(
        &mut self,
        eligible: impl Fn(&Member<K, T>) -> bool,
        random: u64,
    ) -> Option<usize> {
        let total: u64 = self
            .members
            .iter()
            .filter(|m| eligible(m))
            .map(|m| u64::from(m.weight))
            .sum();
        if total == 0 {
            return None;
        }
        let mut point = random % total;
        for (index, member) in self.members.iter().enumerate() {
            if !eligible(member) {
                continue;
            }
            let weight = u64::from(member.weight);
            if point < weight {
                return Some(index);
            }
            point -= weight;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(strategy: Strategy, weights: &[u32]) -> ServingSet<u8, ()> {
        let mut set = ServingSet::new(strategy);
        for (key, weight) in weights.iter().enumerate() {
            set.insert(key as u8, (), *weight, true);
        }
        set
    }

    /// Picks `n` short streams (each released at once) and counts them per member.
    fn spread(
        set: &mut ServingSet<u8, ()>,
        n: u64,
        mut random: impl FnMut(u64) -> u64,
    ) -> Vec<u64> {
        let mut counts = vec![
            0;
            set.members()
                .iter()
                .map(|m| usize::from(m.key) + 1)
                .max()
                .unwrap_or(0)
        ];
        for i in 0..n {
            let key = set.pick(&[], random(i)).expect("a member").key;
            counts[usize::from(key)] += 1;
            set.release(key);
        }
        counts
    }

    /// A tiny deterministic generator (splitmix64) so the random test needs no crate.
    fn splitmix(i: u64) -> u64 {
        let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn least_connections_spreads_short_streams_evenly() {
        let mut set = set(Strategy::LeastConnections, &[1, 1]);
        assert_eq!(spread(&mut set, 1000, |_| 0), vec![500, 500]);
    }

    #[test]
    fn pick_if_skips_what_the_caller_refuses_under_every_strategy() {
        for strategy in [
            Strategy::LeastConnections,
            Strategy::RoundRobin,
            Strategy::Random,
        ] {
            let mut set: ServingSet<u8, bool> = ServingSet::new(strategy);
            // The value says whether the member's peer answers.
            set.insert(0, false, 1, true);
            set.insert(1, true, 1, true);
            for random in 0..50 {
                let picked = set.pick_if(&[], random, |answers| *answers).expect("pick");
                assert_eq!(picked.key, 1, "{strategy:?}");
                set.release(1);
            }
            assert!(set.pick_if(&[1], 0, |answers| *answers).is_none());
            assert_eq!(set.members()[1].picked, 50);
            assert_eq!(set.members()[0].picked, 0);
        }
    }

    #[test]
    fn least_connections_prefers_the_least_loaded() {
        let mut set = set(Strategy::LeastConnections, &[1, 1, 1]);
        // Three long streams land on three members; releasing member 1's makes it the pick.
        let picks: Vec<u8> = (0..3)
            .map(|_| set.pick(&[], 0).expect("pick").key)
            .collect();
        assert_eq!(picks, vec![0, 1, 2]);
        set.release(1);
        assert_eq!(set.pick(&[], 0).expect("pick").key, 1);
        assert_eq!(set.members()[1].open, 1);
    }

    #[test]
    fn least_connections_honours_weights() {
        let mut set = set(Strategy::LeastConnections, &[3, 1]);
        // Long-lived streams: the weight-3 member holds three for every one of the other.
        let mut counts = [0; 2];
        for _ in 0..400 {
            counts[usize::from(set.pick(&[], 0).expect("pick").key)] += 1;
        }
        assert_eq!(counts, [300, 100]);
    }

    #[test]
    fn round_robin_is_smooth_and_weighted() {
        let mut set = set(Strategy::RoundRobin, &[1, 1]);
        assert_eq!(spread(&mut set, 1000, |_| 0), vec![500, 500]);
        let mut set = self::set(Strategy::RoundRobin, &[5, 1, 1]);
        let order: Vec<u8> = (0..7)
            .map(|_| set.pick(&[], 0).expect("pick").key)
            .collect();
        // nginx's example: a a b a c a a — interleaved, not a burst of five.
        assert_eq!(order, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn random_is_weighted() {
        let mut set = set(Strategy::Random, &[1, 3]);
        let counts = spread(&mut set, 4000, splitmix);
        assert!((900..=1100).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn withdrawn_and_excluded_members_are_never_picked() {
        for strategy in [
            Strategy::LeastConnections,
            Strategy::RoundRobin,
            Strategy::Random,
        ] {
            let mut set = set(strategy, &[1, 1, 1]);
            assert!(set.set_ready(1, false));
            let counts = spread(&mut set, 300, splitmix);
            assert_eq!(
                counts[1], 0,
                "{strategy:?}: a withdrawn member got visitors"
            );
            assert_eq!(counts[0] + counts[2], 300);
            assert_eq!(set.pick(&[0, 2], 0).map(|m| m.key), None, "{strategy:?}");
            assert!(set.set_ready(1, true));
            assert_eq!(set.pick(&[0, 2], 0).map(|m| m.key), Some(1), "{strategy:?}");
            assert_eq!(set.ready_len(), 3);
        }
    }

    #[test]
    fn retries_walk_through_every_member_once() {
        let mut set = set(Strategy::LeastConnections, &[1, 1, 1]);
        let mut tried = Vec::new();
        while let Some(member) = set.pick(&tried, 0) {
            tried.push(member.key);
        }
        tried.sort_unstable();
        assert_eq!(tried, vec![0, 1, 2]);
    }

    #[test]
    fn leaving_members_take_nothing_with_them() {
        let mut set = set(Strategy::LeastConnections, &[1, 1]);
        let first = set.pick(&[], 0).expect("pick").key;
        assert_eq!(set.remove(first), Some(()));
        assert_eq!(set.remove(first), None);
        set.release(first); // a stream of a member that left: ignored
        assert_eq!(spread(&mut set, 10, |_| 0).iter().sum::<u64>(), 10);
        set.remove(1 - first);
        assert!(set.is_empty());
        assert!(set.pick(&[], 0).is_none());
    }

    #[test]
    fn rejoining_keeps_open_streams_and_updates_weight() {
        let mut set = set(Strategy::LeastConnections, &[1]);
        set.pick(&[], 0);
        set.insert(0, (), 0, false);
        let member = &set.members()[0];
        assert_eq!((member.open, member.weight, member.ready), (1, 1, false));
        set.insert(0, (), u32::MAX, true);
        assert_eq!(set.members()[0].weight, MAX_WEIGHT);
    }

    #[test]
    fn strategy_names_round_trip() {
        for strategy in [
            Strategy::LeastConnections,
            Strategy::RoundRobin,
            Strategy::Random,
        ] {
            assert_eq!(Strategy::from_name(strategy.name()), Some(strategy));
        }
        assert_eq!(Strategy::from_name("fastest"), None);
    }
}
