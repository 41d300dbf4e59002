//! The system resolver's configuration: which server `/etc/resolv.conf` names first.

use std::net::IpAddr;

/// The first `nameserver` line of a resolv.conf text whose address parses. Comments
/// start with `#` or `;` (at the start of a line or after the address); an IPv6 zone
/// (`fe80::1%eth0`) is dropped, since a `SocketAddr` for it would need the interface index.
pub fn parse_resolv_conf(text: &str) -> Option<IpAddr> {
    text.lines().find_map(|line| {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            return None;
        }
        let addr = words.next()?;
        let addr = addr.split('%').next().unwrap_or(addr);
        addr.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::parse_resolv_conf;
    use std::net::IpAddr;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn first_nameserver_wins() {
        let text = "search example.com\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n";
        assert_eq!(parse_resolv_conf(text), ip("10.0.0.2"));
    }

    #[test]
    fn comments_are_skipped() {
        let text = "# nameserver 1.1.1.1\n; nameserver 8.8.8.8\n  nameserver 9.9.9.9 # quad nine\n";
        assert_eq!(parse_resolv_conf(text), ip("9.9.9.9"));
    }

    #[test]
    fn ipv6_with_and_without_zone() {
        assert_eq!(parse_resolv_conf("nameserver ::1\n"), ip("::1"));
        assert_eq!(
            parse_resolv_conf("nameserver fe80::1%eth0\nnameserver 10.0.0.1\n"),
            ip("fe80::1")
        );
    }

    #[test]
    fn missing_or_unparsable_gives_none() {
        assert_eq!(parse_resolv_conf(""), None);
        assert_eq!(parse_resolv_conf("search a.b\noptions ndots:5\n"), None);
        assert_eq!(
            parse_resolv_conf("nameserver\nnameserver not-an-ip\n"),
            None
        );
        assert_eq!(parse_resolv_conf("nameservers 10.0.0.1\n"), None);
    }

    #[test]
    fn unparsable_entry_is_passed_over() {
        assert_eq!(
            parse_resolv_conf("nameserver bogus\nnameserver 10.1.2.3\n"),
            ip("10.1.2.3")
        );
    }
}
