//! The `--rerun` flag: where a recording goes.
//!
//! ```text
//! off                 record nothing
//! spawn               start a Rerun Viewer (`rerun` on PATH) and stream to it
//! save=PATH           write an .rrd file (PATH's folder is created)
//! connect[=URL]       stream to a running viewer: rerun+http://HOST:PORT/proxy, or HOST:PORT
//!                     (default rerun+http://127.0.0.1:9876/proxy)
//! serve[=[HOST:]PORT] serve the recording over gRPC for viewers to connect to; binds
//!                     127.0.0.1 unless HOST is given (default port 9876)
//! ```

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// The port Rerun viewers listen on and connect to by default.
pub const DEFAULT_PORT: u16 = 9876;

/// Where a recording goes (`--rerun VALUE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RerunSink {
    /// Nothing is recorded.
    Off,
    /// Spawn a viewer and stream to it.
    Spawn,
    /// Write an .rrd file.
    Save(PathBuf),
    /// Stream to a running viewer at this `rerun+http://.../proxy` URL.
    Connect(String),
    /// Serve over gRPC on `bind:port`.
    Serve {
        /// Address to bind (loopback unless asked otherwise).
        bind: IpAddr,
        /// TCP port.
        port: u16,
    },
}

/// A `--rerun` value that is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--rerun {value:?}: {reason} (expected off, spawn, save=PATH, connect[=URL] or serve[=[HOST:]PORT])"
)]
pub struct SinkParseError {
    /// What was given.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

fn default_connect_url() -> String {
    format!("rerun+http://127.0.0.1:{DEFAULT_PORT}/proxy")
}

fn parse_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) => Err("port 0 would bind a random port a viewer cannot know".into()),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("{s:?} is not a port number (1-65535)")),
    }
}

impl FromStr for RerunSink {
    type Err = SinkParseError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| SinkParseError {
            value: value.to_string(),
            reason,
        };
        let (kind, arg) = match value.split_once('=') {
            Some((k, a)) => (k, Some(a)),
            None => (value, None),
        };
        match (kind, arg) {
            ("off", None) => Ok(Self::Off),
            ("spawn", None) => Ok(Self::Spawn),
            ("off" | "spawn", Some(_)) => Err(err(format!("{kind} takes no value"))),
            ("save", Some(p)) if !p.is_empty() => Ok(Self::Save(PathBuf::from(p))),
            ("save", _) => Err(err("save needs a file path: save=PATH".into())),
            ("connect", None) => Ok(Self::Connect(default_connect_url())),
            ("connect", Some(u)) => {
                let url = if u.contains("://") {
                    u.to_string()
                } else if u
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && parse_port(p).is_ok())
                {
                    format!("rerun+http://{u}/proxy")
                } else {
                    return Err(err(format!(
                        "{u:?} is neither a rerun+http://HOST:PORT/proxy URL nor HOST:PORT"
                    )));
                };
                match url.parse::<rerun::external::re_uri::RedapUri>() {
                    Ok(rerun::external::re_uri::RedapUri::Proxy(_)) => Ok(Self::Connect(url)),
                    Ok(_) => Err(err(format!(
                        "{url} is not a viewer's proxy endpoint (it must end in /proxy)"
                    ))),
                    Err(e) => Err(err(format!("{url}: {e}"))),
                }
            }
            ("serve", None) => Ok(Self::Serve {
                bind: IpAddr::from([127, 0, 0, 1]),
                port: DEFAULT_PORT,
            }),
            ("serve", Some(a)) => {
                let (bind, port) = match a.rsplit_once(':') {
                    Some((h, p)) => {
                        let h = h.trim_start_matches('[').trim_end_matches(']');
                        let bind = h.parse::<IpAddr>().map_err(|_| {
                            err(format!("{h:?} is not an IP address to bind (e.g. 0.0.0.0)"))
                        })?;
                        (bind, p)
                    }
                    None => (IpAddr::from([127, 0, 0, 1]), a),
                };
                Ok(Self::Serve {
                    bind,
                    port: parse_port(port).map_err(err)?,
                })
            }
            _ => Err(err(format!("unknown sink {kind:?}"))),
        }
    }
}

impl fmt::Display for RerunSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => write!(f, "off"),
            Self::Spawn => write!(f, "spawn"),
            Self::Save(p) => write!(f, "save={}", p.display()),
            Self::Connect(u) => write!(f, "connect={u}"),
            Self::Serve { bind, port } => match bind {
                IpAddr::V6(b) => write!(f, "serve=[{b}]:{port}"),
                IpAddr::V4(b) => write!(f, "serve={b}:{port}"),
            },
        }
    }
}

impl RerunSink {
    /// The default of `diffrl run`: the run folder's `recording.rrd`.
    pub fn run_default(run_dir: &std::path::Path) -> Self {
        Self::Save(run_dir.join(crate::RECORDING_FILE))
    }

    /// Whether anything is recorded.
    pub fn is_on(&self) -> bool {
        *self != Self::Off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> RerunSink {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn bad(s: &str) -> String {
        s.parse::<RerunSink>().unwrap_err().to_string()
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(ok("off"), RerunSink::Off);
        assert_eq!(ok("spawn"), RerunSink::Spawn);
        assert_eq!(
            ok("save=runs/a/recording.rrd"),
            RerunSink::Save("runs/a/recording.rrd".into())
        );
        assert_eq!(
            ok("save=a=b.rrd"),
            RerunSink::Save("a=b.rrd".into()),
            "only the first = separates"
        );
        assert_eq!(
            ok("connect"),
            RerunSink::Connect("rerun+http://127.0.0.1:9876/proxy".into())
        );
        assert_eq!(
            ok("connect=10.0.0.2:9000"),
            RerunSink::Connect("rerun+http://10.0.0.2:9000/proxy".into())
        );
        assert_eq!(
            ok("connect=rerun+http://viewer.lab:9876/proxy"),
            RerunSink::Connect("rerun+http://viewer.lab:9876/proxy".into())
        );
        let lo = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(
            ok("serve"),
            RerunSink::Serve {
                bind: lo,
                port: 9876
            }
        );
        assert_eq!(
            ok("serve=9000"),
            RerunSink::Serve {
                bind: lo,
                port: 9000
            },
            "serve binds loopback unless told otherwise"
        );
        assert_eq!(
            ok("serve=0.0.0.0:9000"),
            RerunSink::Serve {
                bind: IpAddr::from([0, 0, 0, 0]),
                port: 9000
            }
        );
        assert_eq!(
            ok("serve=[::1]:9000"),
            RerunSink::Serve {
                bind: "::1".parse().unwrap(),
                port: 9000
            }
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "off",
            "spawn",
            "save=x.rrd",
            "connect=rerun+http://127.0.0.1:9876/proxy",
            "serve=127.0.0.1:9000",
            "serve=[::1]:9000",
        ] {
            assert_eq!(ok(s).to_string(), s);
            assert_eq!(ok(&ok(s).to_string()), ok(s));
        }
    }

    #[test]
    fn rejected_forms_say_why() {
        assert!(bad("").contains("unknown sink"));
        assert!(bad("file=x.rrd").contains("unknown sink \"file\""));
        assert!(bad("save").contains("save=PATH"));
        assert!(bad("save=").contains("save=PATH"));
        assert!(bad("spawn=1").contains("takes no value"));
        assert!(bad("serve=http").contains("not a port"));
        assert!(bad("serve=0").contains("port 0"));
        assert!(bad("serve=99999").contains("not a port"));
        assert!(bad("serve=localhost:9000").contains("not an IP address"));
        assert!(bad("connect=viewer").contains("neither"));
        assert!(bad("connect=rerun+http://127.0.0.1:9876").contains("proxy"));
        assert!(bad("connect=ftp://x:1/proxy").contains("ftp"));
        // Every error lists the accepted forms.
        assert!(bad("nope").contains("save=PATH, connect[=URL] or serve[=[HOST:]PORT]"));
    }
}
