//! Tests of the ban list and strikes.

use super::*;

const RULE: BanRule = BanRule {
    after: 3,
    within_ms: 10_000,
    for_ms: 60_000,
    from_check: false,
};

fn ip(s: &str) -> Ident {
    Ident::Ip(s.parse().unwrap())
}

/// (ms of each rejection, count after it): the span starts at the first rejection
/// and a rejection past it starts a new one.
#[test]
fn strikes_count_within_the_span() {
    let bans = Bans::default();
    let cases = [(0, 1), (1_000, 2), (9_999, 3), (10_000, 1), (15_000, 2)];
    for (at, want) in cases {
        assert_eq!(
            bans.strike(Scope::Ip, &ip("1.2.3.4"), &RULE, at),
            want,
            "at {at}"
        );
    }
    // Another identity, another scope: counted apart.
    assert_eq!(bans.strike(Scope::Key, &ip("1.2.3.4"), &RULE, 15_000), 1);
    assert_eq!(bans.strike(Scope::Ip, &ip("1.2.3.5"), &RULE, 15_000), 1);
}

/// A ban is in force until it expires, then gone; lifting it by id ends it at once.
#[test]
fn bans_expire_and_lift() {
    let bans = Bans::default();
    let who = ip("203.0.113.7");
    assert_eq!(bans.banned(Scope::Ip, &who, 0), None);
    let ban = Ban::new(Scope::Ip, &who, &RULE, 1_000);
    assert_eq!(ban.reason, "automatic: 3 rate-limit rejections in 10s");
    assert_eq!(ban.retry_after_secs(1_000), 60);
    assert_eq!(ban.retry_after_secs(60_500), 1);
    bans.insert(who.clone(), ban.clone(), 1_000);
    assert_eq!(bans.banned(Scope::Ip, &who, 60_999), Some(ban.clone()));
    assert_eq!(bans.banned(Scope::Key, &who, 2_000), None);
    assert_eq!(bans.banned(Scope::Ip, &who, 61_000), None);
    assert_eq!(bans.list(2_000), std::slice::from_ref(&ban));
    assert!(ban.id() < 0);
    assert_eq!(bans.lift(ban.id()).as_ref(), Some(&ban));
    assert_eq!(bans.banned(Scope::Ip, &who, 2_000), None);
    assert_eq!(bans.lift(ban.id()), None);
}

/// Values round-trip through their text (what Redis and `/v1/blocks` carry).
#[test]
fn idents_round_trip() {
    let cases = [
        (
            Scope::Ip,
            Ident::client("2001:db8:1:2::9".parse().unwrap(), 64),
        ),
        (Scope::Ip, ip("203.0.113.7")),
        (Scope::Auth, ip("2001:db8::1")),
        (Scope::Key, Ident::Name("key_demo".into())),
        (Scope::Tenant, Ident::Name("acme".into())),
    ];
    for (scope, ident) in cases {
        assert_eq!(parse_ident(scope, &ident.to_string()), Some(ident.clone()));
    }
    assert_eq!(parse_ident(Scope::Key, ""), None);
    assert_eq!(parse_ident(Scope::Ip, "nonsense"), None);
    // Read by `config::parse_net`: an IPv4 network is no identity, an IPv6 one is its
    // network (host bits cleared), a /128 or /32 is the address.
    let net = |s: &str| Some(Ident::Net(s.parse().unwrap()));
    for (value, want) in [
        ("10.0.0.0/8", None),
        ("2001:db8:1::/48", net("2001:db8:1::/48")),
        ("2001:db8:1::9/48", net("2001:db8:1::/48")),
        ("2001:db8::1/128", Some(ip("2001:db8::1"))),
        ("203.0.113.7/32", Some(ip("203.0.113.7"))),
    ] {
        assert_eq!(parse_ident(Scope::Ip, value), want, "{value}");
    }
}

/// A spray of identities does not grow the strike map past its bound.
#[test]
fn strikes_are_bounded() {
    let bans = Bans::default();
    for i in 0..(MAX_STRIKES as u32 + 10) {
        let who = Ident::Ip(std::net::IpAddr::from(i.to_be_bytes()));
        bans.strike(Scope::Ip, &who, &RULE, 0);
    }
    let n = bans.strikes.lock().unwrap().len();
    assert!(n <= MAX_STRIKES, "{n}");
}

/// At the cap a new ban is refused (false) and every ban in force stays; a ban that
/// has ended makes room; renewing a ban in force is not a new one.
#[test]
fn a_full_table_refuses_new_bans_and_keeps_the_old() {
    let bans = Bans::with_caps(3, 10);
    let who = |i: u8| ip(&format!("198.51.100.{i}"));
    let rule = |for_ms| BanRule { for_ms, ..RULE };
    // The attacker's own long ban first, then two short ones on others.
    assert!(bans.insert(who(1), Ban::new(Scope::Ip, &who(1), &rule(3_600_000), 0), 0));
    assert!(bans.insert(who(2), Ban::new(Scope::Ip, &who(2), &rule(1_000), 0), 0));
    assert!(bans.insert(who(3), Ban::new(Scope::Ip, &who(3), &rule(2_000), 0), 0));
    // A flood of bans on others: all refused, the first ban survives.
    for i in 4..100 {
        assert!(!bans.insert(
            who(i),
            Ban::new(Scope::Ip, &who(i), &rule(9_999_999), 10),
            10
        ));
    }
    assert!(bans.banned(Scope::Ip, &who(1), 500).is_some());
    assert!(bans.banned(Scope::Ip, &who(2), 500).is_some());
    // Renewing a ban in force is allowed at the cap.
    assert!(bans.insert(who(2), Ban::new(Scope::Ip, &who(2), &rule(1_000), 600), 600));
    // Once one has ended (the one on .3 at 2 s), there is room again.
    assert!(bans.insert(
        who(50),
        Ban::new(Scope::Ip, &who(50), &rule(1_000), 2_000),
        2_000
    ));
    assert!(bans.banned(Scope::Ip, &who(50), 2_000).is_some());
    assert!(bans.banned(Scope::Ip, &who(1), 2_000).is_some());
    assert_eq!(bans.list(2_000).len(), 2, "{:?}", bans.list(2_000));
}

/// A ban restarts the counting span: rejections while it lasts (a gateway the ban
/// has not reached) count nothing, and once it ends `after` rejections within
/// `within` ban again, even inside the span that led to the first ban.
#[test]
fn a_ban_that_ends_can_be_struck_again() {
    let bans = Bans::default();
    let who = ip("192.0.2.9");
    let rule = BanRule {
        for_ms: 5_000,
        ..RULE
    }; // shorter than the 10 s span
    for (at, want) in [(0, 1), (1_000, 2), (2_000, 3)] {
        assert_eq!(bans.strike(Scope::Ip, &who, &rule, at), want);
    }
    assert!(bans.insert(who.clone(), Ban::new(Scope::Ip, &who, &rule, 2_000), 2_000));
    assert_eq!(
        bans.strike(Scope::Ip, &who, &rule, 3_000),
        0,
        "quiet while banned"
    );
    assert_eq!(bans.banned(Scope::Ip, &who, 7_000), None, "ended at 7 s");
    for (at, want) in [(7_000, 1), (7_500, 2), (8_000, 3)] {
        assert_eq!(bans.strike(Scope::Ip, &who, &rule, at), want, "at {at}");
    }
    // Lifting a ban counts afresh too.
    let again = Ban::new(Scope::Ip, &who, &rule, 8_000);
    assert!(bans.insert(who.clone(), again.clone(), 8_000));
    assert_eq!(bans.lift(again.id()), Some(again));
    assert_eq!(bans.strike(Scope::Ip, &who, &rule, 8_500), 1);
}

/// A spray of one-off identities filling the strike map does not reset the count of
/// an identity close to its ban.
#[test]
fn a_spray_does_not_reset_a_count_near_a_ban() {
    let bans = Bans::with_caps(10, 100);
    let who = ip("192.0.2.1");
    bans.strike(Scope::Ip, &who, &RULE, 0);
    bans.strike(Scope::Ip, &who, &RULE, 0);
    for i in 0..1_000u32 {
        let other = Ident::Ip(std::net::IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
        bans.strike(Scope::Ip, &other, &RULE, 1);
    }
    assert!(bans.strikes.lock().unwrap().len() <= 100);
    assert_eq!(bans.strike(Scope::Ip, &who, &RULE, 2), 3);
}

/// On Redis: the first rejection calls, the ones within its interval are held, the
/// first after it sends them all in one call; the local count reaching `after` bans
/// at once.
#[test]
fn shared_strikes_call_once_per_interval_and_carry_the_rest() {
    let bans = Bans::default();
    let who = ip("192.0.2.20");
    let rule = BanRule { after: 10, ..RULE };
    let strike = |at| bans.strike_shared(Scope::Ip, &who, &rule, at, 1_000);
    assert_eq!(strike(0), Tally::Send { n: 1, span_ms: 0 });
    // Within the interval, and while the call is under way: held.
    for at in [1, 200, 999] {
        assert_eq!(strike(at), Tally::Held, "at {at}");
    }
    // The interval is over but the call is not: still held.
    assert_eq!(strike(1_000), Tally::Held);
    bans.sent(Scope::Ip, &who, 0, 0);
    // The next call carries the four held meanwhile and this one.
    assert_eq!(strike(1_001), Tally::Send { n: 5, span_ms: 0 });
    // A failed call: its rejections go with the next.
    bans.sent(Scope::Ip, &who, 0, 5);
    assert_eq!(strike(2_001), Tally::Send { n: 6, span_ms: 0 });
    bans.sent(Scope::Ip, &who, 0, 0);
    // Rejections 8 and 9 held; the 10th (local count = after) bans at once.
    assert_eq!(strike(2_002), Tally::Held);
    assert_eq!(strike(2_003), Tally::Held);
    assert_eq!(strike(2_004), Tally::Ban);
}

/// The interval is the rejection's retry_after, at least `MIN_STRIKE_INTERVAL_MS`,
/// at most the span; a new span drops what was held in the last.
#[test]
fn shared_strike_intervals_are_bounded_and_spans_restart() {
    let bans = Bans::default();
    let who = ip("192.0.2.21");
    let rule = BanRule {
        after: 1_000,
        ..RULE
    }; // a 10 s span
    let strike = |at, every| bans.strike_shared(Scope::Ip, &who, &rule, at, every);
    let done = |span, unsent| bans.sent(Scope::Ip, &who, span, unsent);
    // A 1 ms retry_after waits 100 ms.
    assert_eq!(strike(0, 1), Tally::Send { n: 1, span_ms: 0 });
    done(0, 0);
    assert_eq!(strike(99, 1), Tally::Held);
    // An hour's retry_after waits the span (10 s), not the hour.
    assert_eq!(strike(100, 3_600_000), Tally::Send { n: 2, span_ms: 0 });
    assert_eq!(strike(9_999, 1), Tally::Held);
    // That call fails late, after a new span began (10 s): its rejections belong to
    // the last span and are dropped, as is the one held there.
    assert_eq!(strike(10_050, 1), Tally::Held, "the call is under way");
    done(0, 2);
    assert_eq!(
        strike(10_100, 1),
        Tally::Send {
            n: 2,
            span_ms: 10_050
        }
    );
}

/// A spray of identities on Redis does not grow the table past its bound either.
#[test]
fn shared_strikes_are_bounded() {
    let bans = Bans::with_caps(10, 1_000);
    for i in 0..10_000u32 {
        let who = Ident::Ip(std::net::IpAddr::from(i.to_be_bytes()));
        bans.strike_shared(Scope::Ip, &who, &RULE, 0, 1_000);
    }
    let n = bans.strikes.lock().unwrap().len();
    assert!(n <= 1_000, "{n}");
}

/// Changes from the fleet: set bans go in (their counts go quiet), lifted ones come
/// out (their counts start afresh), ended ones go, the rest stay.
#[test]
fn fleet_changes_apply_incrementally() {
    let bans = Bans::default();
    let (a, b, c) = (ip("198.51.100.1"), ip("198.51.100.2"), ip("198.51.100.3"));
    let short = BanRule {
        for_ms: 1_000,
        ..RULE
    };
    bans.apply(
        vec![
            (a.clone(), Ban::new(Scope::Ip, &a, &RULE, 0)),
            (b.clone(), Ban::new(Scope::Ip, &b, &short, 0)),
        ],
        Vec::new(),
        0,
    );
    assert!(bans.banned(Scope::Ip, &a, 500).is_some());
    assert!(bans.banned(Scope::Ip, &b, 500).is_some());
    // c has a count: a ban on it quiets it.
    bans.strike(Scope::Ip, &c, &RULE, 500);
    bans.apply(
        vec![(c.clone(), Ban::new(Scope::Ip, &c, &short, 500))],
        Vec::new(),
        500,
    );
    assert_eq!(bans.strike(Scope::Ip, &c, &RULE, 600), 0, "quiet");
    // Nothing changed: all stay. Later b's ban ends and it goes.
    bans.apply(Vec::new(), Vec::new(), 700);
    assert_eq!(bans.list(700).len(), 3);
    bans.apply(Vec::new(), Vec::new(), 1_200);
    assert_eq!(bans.list(1_200).len(), 2);
    assert_eq!(
        bans.active.read().unwrap().map.len(),
        2,
        "dropped, not only hidden"
    );
    // a lifted: gone, its count afresh.
    bans.apply(Vec::new(), vec![(Scope::Ip, a.clone())], 1_300);
    assert!(bans.banned(Scope::Ip, &a, 1_300).is_none());
    assert_eq!(bans.strike(Scope::Ip, &a, &RULE, 1_300), 1);
    assert!(bans.banned(Scope::Ip, &c, 1_300).is_some());
}

/// Bans of the decision APIs fill at most half the table: past that theirs are refused,
/// while proxied abuse is still banned up to the full table. A check ban that ends, or
/// is lifted, or is replaced by a proxied one makes room for another; a renewed one
/// needs none.
#[test]
fn decision_api_bans_fill_at_most_half_the_table() {
    let bans = Bans::with_caps(10, 100);
    let who = |n: u32| Ident::Ip(std::net::IpAddr::from([10, 0, 0, n as u8]));
    let ban = |n: u32, at: u64| Ban::new(Scope::Ip, &who(n), &RULE, at);
    let check = |n: u32, at: u64| bans.insert_from(who(n), ban(n, at), at, BanSource::Check);
    let proxy = |n: u32, at: u64| bans.insert_from(who(n), ban(n, at), at, BanSource::Proxy);
    // Rows: (what, identity, when, inserted?)
    type Row<'a> = (&'a dyn Fn(u32, u64) -> bool, u32, u64, bool);
    let rows: [Row<'_>; 13] = [
        (&check, 1, 0, true),
        (&check, 2, 0, true),
        (&check, 3, 0, true),
        (&check, 4, 0, true),
        (&check, 5, 10, true),
        // Half the table (5 of 10) holds check bans: the next is refused ...
        (&check, 6, 20, false),
        // ... a renewal of one held is not a new one ...
        (&check, 1, 20, true),
        // ... and proxied abuse is banned up to the full table.
        (&proxy, 20, 20, true),
        (&proxy, 21, 20, true),
        (&proxy, 22, 20, true),
        (&proxy, 23, 20, true),
        (&proxy, 24, 20, true),
        (&proxy, 25, 20, false),
    ];
    for (i, (insert, n, at, want)) in rows.iter().enumerate() {
        assert_eq!(insert(*n, *at), *want, "row {i}");
    }
    assert_eq!(bans.list(20).len(), 10);
    // A check ban replaced by a proxied one, and a lifted one: room for two.
    assert!(proxy(2, 30));
    assert!(bans.lift(ban(3, 0).id()).is_some());
    assert!(check(7, 30));
    assert!(!check(8, 30), "the table is full again");
    // Once the check bans of t = 0 end (60 s), their room is free again.
    assert!(!check(9, 59_999));
    assert!(check(9, 60_000));
}
