//! The demo's football matches: a pure state machine that turns a random roll into the
//! next match event (kick-off, goals, cards, corners, final whistle, then a new match).
//! No clock and no randomness of its own: the driver passes a random number per step.
//! Each match's [`MatchState`] (score, minute, status) is what the driver stores as the
//! room's state with every event, and what a restarted simulator resumes from.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kickoff,
    Goal,
    Card,
    Corner,
    Final,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Kickoff => "kickoff",
            Kind::Goal => "goal",
            Kind::Card => "card",
            Kind::Corner => "corner",
            Kind::Final => "final",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchEvent {
    pub match_id: u32,
    pub kind: Kind,
    pub home: &'static str,
    pub away: &'static str,
    pub minute: u32,
    /// 0 home, 1 away; `None` for kick-off and final whistle.
    pub team: Option<usize>,
    /// The score after this event.
    pub score: [u32; 2],
    pub text: String,
}

const TEAMS: [(&str, &str); 4] = [
    ("Lions", "Tigers"),
    ("Harbour FC", "City Rovers"),
    ("Red Kites", "Blue Herons"),
    ("Millers", "Foxes"),
];
/// Steps a finished match rests before the next kick-off.
const REST_STEPS: u32 = 6;

/// Where a match stands: stored as its room's state, resumed after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchState {
    pub minute: u32,
    pub score: [u32; 2],
    pub status: Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Before the first kick-off.
    Waiting,
    Playing,
    /// Full time; the next match kicks off after a rest.
    Finished,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Playing => "playing",
            Status::Finished => "finished",
        }
    }

    pub fn parse(text: &str) -> Option<Status> {
        [Status::Waiting, Status::Playing, Status::Finished]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Waiting,
    Playing,
    Resting(u32),
}

#[derive(Debug, Clone)]
struct Match {
    id: u32,
    home: &'static str,
    away: &'static str,
    minute: u32,
    score: [u32; 2],
    phase: Phase,
}

#[derive(Debug, Clone)]
pub struct MatchSim {
    matches: Vec<Match>,
}

impl MatchSim {
    /// `count` matches (at most 4), all waiting for kick-off.
    pub fn new(count: usize) -> Self {
        let matches = TEAMS
            .iter()
            .take(count.clamp(1, TEAMS.len()))
            .enumerate()
            .map(|(i, (home, away))| Match {
                id: i as u32 + 1,
                home,
                away,
                minute: 0,
                score: [0, 0],
                phase: Phase::Waiting,
            })
            .collect();
        MatchSim { matches }
    }

    /// Where match `match_id` stands (`None`: no such match).
    pub fn state(&self, match_id: u32) -> Option<MatchState> {
        let m = self.matches.iter().find(|m| m.id == match_id)?;
        let status = match m.phase {
            Phase::Waiting => Status::Waiting,
            Phase::Playing => Status::Playing,
            Phase::Resting(_) => Status::Finished,
        };
        Some(MatchState { minute: m.minute, score: m.score, status })
    }

    /// Continue match `match_id` from a stored state instead of kicking off again (a
    /// finished match rests, then the next one kicks off). Unknown ids and impossible
    /// states (minute past 90) are ignored.
    pub fn resume(&mut self, match_id: u32, state: MatchState) {
        let Some(m) = self.matches.iter_mut().find(|m| m.id == match_id) else { return };
        if state.minute > 90 {
            return;
        }
        m.minute = state.minute;
        m.score = state.score;
        m.phase = match state.status {
            Status::Waiting => Phase::Waiting,
            Status::Playing => Phase::Playing,
            Status::Finished => Phase::Resting(REST_STEPS),
        };
    }

    pub fn rooms(&self) -> impl Iterator<Item = String> + '_ {
        self.matches.iter().map(|m| format!("match:{}", m.id))
    }

    /// Advance one match, chosen by `roll`; returns its event, if anything happened.
    pub fn step(&mut self, roll: u64) -> Option<MatchEvent> {
        let count = self.matches.len() as u64;
        let m = &mut self.matches[(roll % count) as usize];
        let roll = roll / count;
        let side = (roll % 2) as usize;
        let name = |m: &Match, side: usize| if side == 0 { m.home } else { m.away };
        let (kind, team, text) = match m.phase {
            Phase::Resting(0) | Phase::Waiting => {
                *m = Match { minute: 0, score: [0, 0], phase: Phase::Playing, ..m.clone() };
                (Kind::Kickoff, None, format!("Kick-off: {} v {}", m.home, m.away))
            }
            Phase::Resting(left) => {
                m.phase = Phase::Resting(left - 1);
                return None;
            }
            Phase::Playing => {
                m.minute = (m.minute + 1 + (roll / 2 % 6) as u32).min(90);
                if m.minute >= 90 {
                    m.phase = Phase::Resting(REST_STEPS);
                    let text =
                        format!("Full time: {} {}-{} {}", m.home, m.score[0], m.score[1], m.away);
                    (Kind::Final, None, text)
                } else {
                    match roll / 12 % 100 {
                        0..=11 => {
                            m.score[side] += 1;
                            let text = format!(
                                "Goal! {} {}-{} {}",
                                m.home, m.score[0], m.score[1], m.away
                            );
                            (Kind::Goal, Some(side), text)
                        }
                        12..=29 => {
                            (Kind::Card, Some(side), format!("Yellow card for {}", name(m, side)))
                        }
                        30..=59 => {
                            (Kind::Corner, Some(side), format!("Corner to {}", name(m, side)))
                        }
                        _ => return None,
                    }
                }
            }
        };
        Some(MatchEvent {
            match_id: m.id,
            kind,
            home: m.home,
            away: m.away,
            minute: m.minute,
            team,
            score: m.score,
            text,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_match_kicks_off_scores_and_ends_then_restarts() {
        let mut sim = MatchSim::new(1);
        let first = sim.step(0).unwrap();
        assert_eq!((first.kind, first.score, first.minute), (Kind::Kickoff, [0, 0], 0));
        let mut seen = vec![first];
        let mut roll = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..400 {
            roll ^= roll << 13;
            roll ^= roll >> 7;
            roll ^= roll << 17;
            seen.extend(sim.step(roll));
        }
        let finals = seen.iter().filter(|e| e.kind == Kind::Final).count();
        let kickoffs = seen.iter().filter(|e| e.kind == Kind::Kickoff).count();
        assert!(finals >= 2 && kickoffs >= finals, "finals {finals}, kickoffs {kickoffs}");
        // Within a match, minutes never go back and the score only grows, one goal at a time.
        for pair in seen.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.kind == Kind::Kickoff {
                assert_eq!(b.score, [0, 0]);
                continue;
            }
            assert!(b.minute >= a.minute && b.minute <= 90);
            let goals = |e: &MatchEvent| e.score[0] + e.score[1];
            assert_eq!(goals(b), goals(a) + u32::from(b.kind == Kind::Goal), "{a:?} -> {b:?}");
        }
        assert!(seen.iter().any(|e| e.kind == Kind::Goal));
    }

    #[test]
    fn a_resumed_match_goes_on_from_its_state() {
        let playing = MatchState { minute: 57, score: [2, 1], status: Status::Playing };
        let cases = [
            // (stored, what the next event of the match may be)
            (playing, "goes on at minute 57 or later with 2-1"),
            (
                MatchState { minute: 90, score: [0, 3], status: Status::Finished },
                "rests, then kicks off",
            ),
            (MatchState { minute: 0, score: [0, 0], status: Status::Waiting }, "kicks off"),
        ];
        for (stored, why) in cases {
            let mut sim = MatchSim::new(1);
            sim.resume(1, stored);
            assert_eq!(sim.state(1), Some(stored), "{why}");
            let mut roll = 0x2545_f491_4f6c_dd1du64;
            let next = loop {
                roll ^= roll << 13;
                roll ^= roll >> 7;
                roll ^= roll << 17;
                if let Some(event) = sim.step(roll) {
                    break event;
                }
            };
            match stored.status {
                Status::Playing => {
                    assert_ne!(next.kind, Kind::Kickoff, "{why}");
                    assert!(next.minute >= 57, "{why}: {next:?}");
                    assert!(next.score[0] >= 2 && next.score[1] >= 1, "{why}: {next:?}");
                }
                Status::Finished | Status::Waiting => {
                    assert_eq!((next.kind, next.score), (Kind::Kickoff, [0, 0]), "{why}")
                }
            }
        }
        // Nonsense is ignored.
        let mut sim = MatchSim::new(1);
        sim.resume(1, MatchState { minute: 91, score: [1, 1], status: Status::Playing });
        sim.resume(7, playing);
        assert_eq!(
            sim.state(1),
            Some(MatchState { minute: 0, score: [0, 0], status: Status::Waiting })
        );
        assert_eq!(sim.state(7), None);
        for status in [Status::Waiting, Status::Playing, Status::Finished] {
            assert_eq!(Status::parse(status.as_str()), Some(status));
        }
        assert_eq!(Status::parse("halftime"), None);
    }

    #[test]
    fn rooms_are_named_by_match() {
        assert_eq!(
            MatchSim::new(4).rooms().collect::<Vec<_>>(),
            ["match:1", "match:2", "match:3", "match:4"]
        );
        assert_eq!(MatchSim::new(9).rooms().count(), 4);
    }
}
