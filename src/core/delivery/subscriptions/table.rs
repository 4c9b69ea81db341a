//! A connection's subscriptions by room: a short list while it follows a few rooms (most
//! connections: its inbox and a room or two), a hash map once it follows more. A hash
//! map keeps at least four slots of about a hundred bytes for two entries; the list
//! keeps exactly what it holds, and a few string comparisons cost no more than hashing.

use std::collections::HashMap;
use std::sync::Arc;

/// Entries kept as a list up to this many; more make it a map.
const FEW: usize = 8;

#[derive(Debug)]
pub(super) enum Table<V> {
    Few(Vec<(Arc<str>, V)>),
    Many(HashMap<Arc<str>, V>),
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table::Few(Vec::new())
    }
}

impl<V> Table<V> {
    pub fn len(&self) -> usize {
        match self {
            Table::Few(list) => list.len(),
            Table::Many(map) => map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains_key(&self, room: &str) -> bool {
        self.get(room).is_some()
    }

    pub fn get(&self, room: &str) -> Option<&V> {
        match self {
            Table::Few(list) => list.iter().find(|(r, _)| **r == *room).map(|(_, v)| v),
            Table::Many(map) => map.get(room),
        }
    }

    pub fn get_mut(&mut self, room: &str) -> Option<&mut V> {
        match self {
            Table::Few(list) => list.iter_mut().find(|(r, _)| **r == *room).map(|(_, v)| v),
            Table::Many(map) => map.get_mut(room),
        }
    }

    /// Put `value` under `room`, replacing what was there.
    pub fn insert(&mut self, room: Arc<str>, value: V) {
        match self {
            Table::Few(list) => {
                if let Some(slot) = list.iter_mut().find(|(r, _)| *r == room) {
                    slot.1 = value;
                } else if list.len() < FEW {
                    // One more slot, not the doubling a push would make room for.
                    list.reserve_exact(1);
                    list.push((room, value));
                } else {
                    let mut map: HashMap<_, _> = std::mem::take(list).into_iter().collect();
                    map.insert(room, value);
                    *self = Table::Many(map);
                }
            }
            Table::Many(map) => {
                map.insert(room, value);
            }
        }
    }

    pub fn remove(&mut self, room: &str) -> Option<V> {
        match self {
            Table::Few(list) => {
                let at = list.iter().position(|(r, _)| **r == *room)?;
                let (_, value) = list.swap_remove(at);
                list.shrink_to_fit();
                Some(value)
            }
            Table::Many(map) => {
                let value = map.remove(room)?;
                if map.len() <= FEW / 2 {
                    *self = Table::Few(std::mem::take(map).into_iter().collect());
                }
                Some(value)
            }
        }
    }

    /// Every entry, leaving the table empty (and holding nothing).
    pub fn drain(&mut self) -> std::vec::IntoIter<(Arc<str>, V)> {
        match std::mem::take(self) {
            Table::Few(list) => list.into_iter(),
            Table::Many(map) => map.into_iter().collect::<Vec<_>>().into_iter(),
        }
    }

    pub fn iter(&self) -> Box<dyn Iterator<Item = (&Arc<str>, &V)> + '_> {
        match self {
            Table::Few(list) => Box::new(list.iter().map(|(r, v)| (r, v))),
            Table::Many(map) => Box::new(map.iter()),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        self.iter().map(|(r, _)| r)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// How many entries it has room for without growing (tests).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        match self {
            Table::Few(list) => list.capacity(),
            Table::Many(map) => map.capacity(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_rooms_are_a_list_of_exactly_their_size_and_more_a_map_with_the_same_answers() {
        let mut table = Table::default();
        let mut model = HashMap::new();
        let room = |i: usize| -> Arc<str> { format!("room:{i}").into() };
        for i in 0..3 {
            table.insert(room(i), i);
            model.insert(room(i), i);
        }
        assert!(matches!(table, Table::Few(_)));
        assert_eq!(table.capacity(), 3, "no spare slots for an idle connection's rooms");
        table.insert(room(1), 10);
        model.insert(room(1), 10);
        for i in 3..20 {
            table.insert(room(i), i);
            model.insert(room(i), i);
        }
        assert!(matches!(table, Table::Many(_)));
        for i in (0..20).step_by(3) {
            assert_eq!(table.remove(&room(i)), model.remove(&room(i)));
        }
        assert_eq!(table.remove("room:absent"), None);
        let check = |table: &Table<usize>, model: &HashMap<Arc<str>, usize>| {
            assert_eq!(table.len(), model.len());
            for (room, value) in model {
                assert_eq!(table.get(room), Some(value));
            }
            let mut keys: Vec<_> = table.keys().cloned().collect();
            keys.sort();
            let mut expected: Vec<_> = model.keys().cloned().collect();
            expected.sort();
            assert_eq!(keys, expected);
        };
        check(&table, &model);
        while model.len() > 2 {
            let any = model.keys().next().unwrap().clone();
            assert_eq!(table.remove(&any), model.remove(&any));
            check(&table, &model);
        }
        assert!(matches!(table, Table::Few(_)), "back to a list once it follows a few");
        let mut drained: Vec<_> = table.drain().collect();
        drained.sort();
        let mut expected: Vec<_> = model.into_iter().collect();
        expected.sort();
        assert_eq!(drained, expected);
        assert!(table.is_empty());
        assert_eq!(table.capacity(), 0);
    }
}
