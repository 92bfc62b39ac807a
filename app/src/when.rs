//! When to train: one rule, pure and clocked from outside, that decides from
//! what the machine reports (time since the last keyboard or mouse input,
//! other programs on the GPU, a full-screen window, the power source, the
//! GPU's temperature, the time of day) whether this node computes now or
//! pauses, and why. The app's worker samples the sources and applies the
//! decision to the node's pause flag; the tests drive it with a fake clock.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What the user chose. The defaults are what a gamer would expect: never
/// over a game (full screen, or another program busy on the GPU), not on
/// battery, stop when the GPU runs hot; training while the user works at
/// the desktop is on, so a first Join trains at once (an idle wait is one
/// setting away).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rules {
    /// Train only after this many minutes without keyboard or mouse input
    /// (0, the default: also while the user is at the machine).
    pub idle_minutes: u32,
    /// Pause while other programs use more than this share of the GPU, in
    /// percent (a game, a render, a video call); 100 turns the rule off.
    pub busy_gpu_percent: u8,
    /// Pause while a full-screen window is in front (most games).
    pub pause_on_fullscreen: bool,
    /// Pause while the machine runs on battery.
    pub pause_on_battery: bool,
    /// Train only inside this daily window (local time), if set.
    pub schedule: Option<Window>,
    /// Pause at this GPU temperature (°C) and resume once it is
    /// [`COOL_DOWN_C`] below it; 0 turns the rule off.
    pub thermal_limit_c: u32,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            idle_minutes: 0,
            busy_gpu_percent: 30,
            pause_on_fullscreen: true,
            pause_on_battery: true,
            schedule: None,
            thermal_limit_c: 83,
        }
    }
}

/// How far below the thermal limit the GPU must cool before training
/// resumes, so it does not flap around the limit.
pub const COOL_DOWN_C: u32 = 8;

/// How long another program's GPU load must stay under the limit before
/// training resumes (a game between two matches is still a game).
pub const GPU_QUIET: Duration = Duration::from_secs(60);

/// A daily window in minutes after local midnight; `from > until` spans
/// midnight (22:00–07:00 is `from: 1320, until: 420`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub from: u16,
    pub until: u16,
}

impl Window {
    pub fn contains(&self, minute: u16) -> bool {
        if self.from <= self.until {
            (self.from..self.until).contains(&minute)
        } else {
            minute >= self.from || minute < self.until
        }
    }
}

/// One reading of the machine. A source this platform cannot read is
/// `None`, and a rule that needs it does not pause (the settings say which
/// rules have no source here).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Monotonic time of the reading.
    pub at: Duration,
    /// Minutes after local midnight.
    pub minute_of_day: u16,
    /// Time since the last keyboard or mouse input.
    pub input_idle: Option<Duration>,
    /// GPU utilisation by programs other than this one, in percent.
    pub other_gpu_percent: Option<u8>,
    pub fullscreen: Option<bool>,
    pub on_battery: Option<bool>,
    pub gpu_temp_c: Option<u32>,
}

/// Why the node is not computing. Listed in the order a person is told:
/// the first that applies is the one shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The user paused it (tray or training screen).
    ByUser,
    TooHot {
        celsius: u32,
    },
    OnBattery,
    OutsideSchedule,
    FullScreen,
    GpuBusy {
        percent: u8,
    },
    UserActive,
}

impl Reason {
    /// What the tray and the training screen say.
    pub fn words(&self) -> String {
        match self {
            Reason::ByUser => "paused by you".into(),
            Reason::TooHot { celsius } => {
                format!("paused: the GPU is at {celsius} °C, waiting for it to cool")
            }
            Reason::OnBattery => "paused: running on battery".into(),
            Reason::OutsideSchedule => "paused: outside your training hours".into(),
            Reason::FullScreen => "paused: a full-screen program is in front".into(),
            Reason::GpuBusy { percent } => {
                format!("paused: another program uses {percent}% of the GPU")
            }
            Reason::UserActive => "paused: you are using the computer".into(),
        }
    }
}

/// Whether the node computes, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Training,
    Paused(Reason),
}

impl State {
    pub fn paused(&self) -> bool {
        matches!(self, State::Paused(_))
    }
}

/// The rule with its memory (hysteresis on temperature, quiet time after
/// another program's GPU load).
#[derive(Debug, Clone)]
pub struct Policy {
    pub rules: Rules,
    /// The user's own pause, which outranks every rule.
    pub by_user: bool,
    state: State,
    /// Set at the limit, cleared [`COOL_DOWN_C`] below it.
    hot: bool,
    /// When another program's GPU load was last over the limit.
    gpu_busy_at: Option<Duration>,
    /// The load that paused it, for the words shown.
    gpu_busy_percent: u8,
}

impl Policy {
    /// A new policy starts paused until its first sample says otherwise:
    /// nothing trains before the machine has been read.
    pub fn new(rules: Rules) -> Self {
        Policy {
            rules,
            by_user: false,
            state: State::Paused(Reason::UserActive),
            hot: false,
            gpu_busy_at: None,
            gpu_busy_percent: 0,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// Folds in one reading; the new state, and whether it changed.
    pub fn update(&mut self, s: &Sample) -> (State, bool) {
        let r = self.rules;
        if let Some(t) = s.gpu_temp_c
            && r.thermal_limit_c > 0
        {
            if t >= r.thermal_limit_c {
                self.hot = true;
            } else if t + COOL_DOWN_C <= r.thermal_limit_c {
                self.hot = false;
            }
        }
        if let Some(p) = s.other_gpu_percent
            && r.busy_gpu_percent < 100
            && p > r.busy_gpu_percent
        {
            self.gpu_busy_at = Some(s.at);
            self.gpu_busy_percent = p;
        }
        let gpu_busy = self
            .gpu_busy_at
            .is_some_and(|t| s.at.saturating_sub(t) < GPU_QUIET);
        let active = r.idle_minutes > 0
            && s.input_idle
                .is_some_and(|i| i < Duration::from_secs(60 * u64::from(r.idle_minutes)));
        let reason = if self.by_user {
            Some(Reason::ByUser)
        } else if self.hot {
            Some(Reason::TooHot {
                celsius: s.gpu_temp_c.unwrap_or(r.thermal_limit_c),
            })
        } else if r.pause_on_battery && s.on_battery == Some(true) {
            Some(Reason::OnBattery)
        } else if r.schedule.is_some_and(|w| !w.contains(s.minute_of_day)) {
            Some(Reason::OutsideSchedule)
        } else if r.pause_on_fullscreen && s.fullscreen == Some(true) {
            Some(Reason::FullScreen)
        } else if gpu_busy {
            Some(Reason::GpuBusy {
                percent: self.gpu_busy_percent,
            })
        } else if active {
            Some(Reason::UserActive)
        } else {
            None
        };
        let next = reason.map_or(State::Training, State::Paused);
        let changed = next != self.state;
        self.state = next;
        (next, changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults with a five-minute idle wait.
    const IDLE_5: Rules = Rules {
        idle_minutes: 5,
        busy_gpu_percent: 30,
        pause_on_fullscreen: true,
        pause_on_battery: true,
        schedule: None,
        thermal_limit_c: 83,
    };

    /// A fake machine: a clock and the sources, advanced by the test.
    struct Machine {
        policy: Policy,
        s: Sample,
    }

    impl Machine {
        fn new(rules: Rules) -> Self {
            Machine {
                policy: Policy::new(rules),
                s: Sample {
                    at: Duration::ZERO,
                    minute_of_day: 12 * 60,
                    input_idle: Some(Duration::ZERO),
                    other_gpu_percent: Some(0),
                    fullscreen: Some(false),
                    on_battery: Some(false),
                    gpu_temp_c: Some(50),
                },
            }
        }

        /// Time passes with no input.
        fn wait(&mut self, secs: u64) -> State {
            let d = Duration::from_secs(secs);
            self.s.at += d;
            self.s.input_idle = self.s.input_idle.map(|i| i + d);
            self.policy.update(&self.s).0
        }

        /// The user touches the keyboard.
        fn input(&mut self) -> State {
            self.s.input_idle = Some(Duration::ZERO);
            self.policy.update(&self.s).0
        }

        fn read(&mut self) -> State {
            self.policy.update(&self.s).0
        }
    }

    #[test]
    fn idle_then_training_then_the_user_returns_and_it_pauses_then_resumes_when_idle_again() {
        let mut m = Machine::new(IDLE_5);
        assert_eq!(m.read(), State::Paused(Reason::UserActive));
        assert_eq!(m.wait(4 * 60 + 59), State::Paused(Reason::UserActive));
        assert_eq!(m.wait(1), State::Training);
        assert_eq!(m.wait(3600), State::Training);
        assert_eq!(m.input(), State::Paused(Reason::UserActive));
        assert_eq!(m.wait(60), State::Paused(Reason::UserActive));
        assert_eq!(m.wait(4 * 60), State::Training);
    }

    #[test]
    fn a_change_is_reported_once() {
        let mut m = Machine::new(IDLE_5);
        m.wait(300);
        let (_, changed) = m.policy.update(&m.s);
        assert!(!changed);
        m.s.input_idle = Some(Duration::ZERO);
        assert_eq!(
            m.policy.update(&m.s),
            (State::Paused(Reason::UserActive), true)
        );
        assert!(!m.policy.update(&m.s).1);
    }

    #[test]
    fn zero_idle_minutes_trains_while_the_user_works() {
        let mut m = Machine::new(Rules::default());
        assert_eq!(m.input(), State::Training);
        assert_eq!(
            Rules::default(),
            Rules {
                idle_minutes: 0,
                ..IDLE_5
            }
        );
    }

    #[test]
    fn the_thermal_limit_pauses_and_training_resumes_only_after_cooling_down() {
        let mut m = Machine::new(IDLE_5);
        m.wait(300);
        m.s.gpu_temp_c = Some(83);
        assert_eq!(m.read(), State::Paused(Reason::TooHot { celsius: 83 }));
        // Just under the limit is not cool enough.
        m.s.gpu_temp_c = Some(80);
        assert_eq!(m.read(), State::Paused(Reason::TooHot { celsius: 80 }));
        m.s.gpu_temp_c = Some(75);
        assert_eq!(m.read(), State::Training);
        // Off: no limit at all.
        m.policy.rules.thermal_limit_c = 0;
        m.s.gpu_temp_c = Some(99);
        assert_eq!(m.read(), State::Training);
    }

    #[test]
    fn on_battery_it_pauses_and_back_on_the_mains_it_resumes() {
        let mut m = Machine::new(IDLE_5);
        m.wait(300);
        m.s.on_battery = Some(true);
        assert_eq!(m.read(), State::Paused(Reason::OnBattery));
        m.s.on_battery = Some(false);
        assert_eq!(m.read(), State::Training);
        m.policy.rules.pause_on_battery = false;
        m.s.on_battery = Some(true);
        assert_eq!(m.read(), State::Training);
    }

    #[test]
    fn a_schedule_across_midnight_trains_at_night_only() {
        let night = Window {
            from: 22 * 60,
            until: 7 * 60,
        };
        assert!(night.contains(23 * 60) && night.contains(0) && night.contains(6 * 60 + 59));
        assert!(!night.contains(7 * 60) && !night.contains(12 * 60));
        let day = Window {
            from: 9 * 60,
            until: 17 * 60,
        };
        assert!(day.contains(9 * 60) && !day.contains(17 * 60) && !day.contains(3 * 60));
        let mut m = Machine::new(Rules {
            schedule: Some(night),
            ..IDLE_5
        });
        m.wait(300);
        assert_eq!(m.read(), State::Paused(Reason::OutsideSchedule));
        m.s.minute_of_day = 23 * 60;
        assert_eq!(m.read(), State::Training);
    }

    #[test]
    fn a_game_on_the_gpu_pauses_and_training_waits_for_a_quiet_minute() {
        let mut m = Machine::new(IDLE_5);
        m.wait(300);
        // A game in a window (not full screen) with the controller idle.
        m.s.other_gpu_percent = Some(90);
        assert_eq!(m.wait(10), State::Paused(Reason::GpuBusy { percent: 90 }));
        m.s.other_gpu_percent = Some(5);
        assert_eq!(m.wait(30), State::Paused(Reason::GpuBusy { percent: 90 }));
        assert_eq!(m.wait(30), State::Training);
        // Full screen pauses at once, whatever the GPU load.
        m.s.fullscreen = Some(true);
        assert_eq!(m.read(), State::Paused(Reason::FullScreen));
        m.s.fullscreen = Some(false);
        assert_eq!(m.read(), State::Training);
    }

    #[test]
    fn sources_this_platform_cannot_read_never_pause() {
        let mut m = Machine::new(IDLE_5);
        m.s = Sample {
            at: Duration::from_secs(1),
            minute_of_day: 0,
            ..Sample::default()
        };
        assert_eq!(m.read(), State::Training);
    }

    #[test]
    fn the_users_pause_outranks_every_rule_and_the_first_reason_is_shown() {
        let mut m = Machine::new(IDLE_5);
        m.s.on_battery = Some(true);
        m.s.gpu_temp_c = Some(90);
        assert_eq!(m.read(), State::Paused(Reason::TooHot { celsius: 90 }));
        m.policy.by_user = true;
        assert_eq!(m.read(), State::Paused(Reason::ByUser));
        m.policy.by_user = false;
        m.s.gpu_temp_c = Some(40);
        assert_eq!(m.read(), State::Paused(Reason::OnBattery));
        assert!(Reason::OnBattery.words().contains("battery"));
    }
}
