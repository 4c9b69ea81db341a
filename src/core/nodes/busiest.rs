//! The admin page's "busiest rooms": the `k` rooms with the most explicit subscribers out
//! of any number of rooms, in one pass that keeps at most `k` of them (a min-heap), so the
//! cost is bounded by `k` in memory and by the rooms once in time. Pure: the caller hands
//! it what each room reported.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One room as it reported itself: its explicit subscribers here and its durable head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomLoad<N> {
    pub room: N,
    pub subscribers: u64,
    pub head: u64,
}

/// Busier first: more subscribers, then the higher head, then the name (so equal loads
/// come out in a stable order).
fn busier<N: Ord>(a: &RoomLoad<N>, b: &RoomLoad<N>) -> Ordering {
    b.subscribers.cmp(&a.subscribers).then(b.head.cmp(&a.head)).then(a.room.cmp(&b.room))
}

/// Ordered so the heap's top is the least busy room kept (the one to drop next).
struct Kept<N>(RoomLoad<N>);

impl<N: Ord> PartialEq for Kept<N> {
    fn eq(&self, other: &Self) -> bool {
        busier(&self.0, &other.0) == Ordering::Equal
    }
}
impl<N: Ord> Eq for Kept<N> {}
impl<N: Ord> PartialOrd for Kept<N> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<N: Ord> Ord for Kept<N> {
    fn cmp(&self, other: &Self) -> Ordering {
        busier(&self.0, &other.0)
    }
}

/// The `k` busiest of `rooms`, busiest first.
pub fn busiest<N: Ord>(rooms: impl IntoIterator<Item = RoomLoad<N>>, k: usize) -> Vec<RoomLoad<N>> {
    if k == 0 {
        return Vec::new();
    }
    let mut heap: BinaryHeap<Kept<N>> = BinaryHeap::with_capacity(k + 1);
    for room in rooms {
        if heap.len() == k {
            // The top is the least busy kept: a room no busier than it is never kept.
            let least = heap.peek().expect("k > 0 rooms kept");
            if busier(&room, &least.0) != Ordering::Less {
                continue;
            }
        }
        heap.push(Kept(room));
        if heap.len() > k {
            heap.pop();
        }
    }
    let mut out: Vec<RoomLoad<N>> = heap.into_iter().map(|kept| kept.0).collect();
    out.sort_by(busier);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(room: &'static str, subscribers: u64, head: u64) -> RoomLoad<&'static str> {
        RoomLoad { room, subscribers, head }
    }

    fn names(rooms: &[RoomLoad<&'static str>]) -> Vec<&'static str> {
        rooms.iter().map(|r| r.room).collect()
    }

    #[test]
    fn keeps_the_k_busiest_in_order() {
        let rooms = [
            load("a", 1, 5),
            load("b", 10, 0),
            load("c", 3, 9),
            load("d", 3, 2),
            load("e", 0, 99),
            load("f", 10, 0),
        ];
        let cases: &[(usize, &[&str])] = &[
            (0, &[]),
            (1, &["b"]),
            (2, &["b", "f"]),
            (3, &["b", "f", "c"]),
            (4, &["b", "f", "c", "d"]),
            (6, &["b", "f", "c", "d", "a", "e"]),
            (20, &["b", "f", "c", "d", "a", "e"]),
        ];
        for (k, expected) in cases {
            assert_eq!(names(&busiest(rooms.clone(), *k)), *expected, "k = {k}");
        }
    }

    #[test]
    fn the_input_order_does_not_matter() {
        let mut rooms: Vec<RoomLoad<&'static str>> = vec![
            load("a", 1, 5),
            load("b", 10, 0),
            load("c", 3, 9),
            load("d", 3, 2),
            load("e", 0, 99),
            load("f", 10, 0),
        ];
        let expected = names(&busiest(rooms.clone(), 3));
        for _ in 0..rooms.len() {
            rooms.rotate_left(1);
            assert_eq!(names(&busiest(rooms.clone(), 3)), expected);
            rooms.reverse();
            assert_eq!(names(&busiest(rooms.clone(), 3)), expected);
        }
    }

    #[test]
    fn many_rooms_keep_only_k() {
        let rooms = (0..10_000u64).map(|i| RoomLoad { room: i, subscribers: i % 997, head: i });
        let top = busiest(rooms, 20);
        assert_eq!(top.len(), 20);
        assert_eq!(top[0], RoomLoad { room: 9969, subscribers: 996, head: 9969 });
        assert!(top.windows(2).all(|w| busier(&w[0], &w[1]) == Ordering::Less));
        assert!(top.iter().all(|r| r.subscribers >= 995));
    }
}
