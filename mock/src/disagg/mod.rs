//! Prefill/decode disaggregation: the engine's role, and what the vLLM (NixlConnector)
//! and SGLang handoff fields of a request ask of it. Pure: the caller supplies the
//! request's fields, its prompt text and the engine's identity, and runs the plan.

use std::fmt;
use std::hash::{DefaultHasher, Hasher};
use std::io::Write as _;
use std::net::SocketAddr;
use std::str::FromStr;

use serde_json::Value;

/// What an engine serves in a disaggregated deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Prefills for decode engines: answers vLLM's stage 1 with `kv_transfer_params`,
    /// and SGLang requests with their first token.
    Prefill,
    /// Decodes prompts prefilled elsewhere: valid transfer fields skip the prefill.
    Decode,
    /// A whole engine (the default): serves both vLLM stages, ignores SGLang's fields.
    #[default]
    Both,
}

impl Role {
    /// Every role's name, for messages.
    pub const NAMES: &'static str = "prefill, decode, both";

    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
        }
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            "both" => Ok(Role::Both),
            _ => Err(format!(
                "unknown role `{s}` (expected one of: {})",
                Role::NAMES
            )),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The two handoff protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Vllm,
    Sglang,
}

impl Protocol {
    pub const ALL: [Protocol; 2] = [Protocol::Vllm, Protocol::Sglang];

    /// The `protocol` label of the mock's metrics.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Vllm => "vllm",
            Protocol::Sglang => "sglang",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Handoffs seen, per protocol: the mock's `/metrics` counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Decode side: prompts whose KV was received (prefill skipped).
    pub received: [u64; 2],
    /// Decode side: transfer fields that did not check out, prefilled locally.
    pub fallback: [u64; 2],
    /// Prefill side: prefills finished for a decode engine.
    pub prefills: [u64; 2],
}

impl Counts {
    pub fn received(&self, p: Protocol) -> u64 {
        self.received[p.index()]
    }

    pub fn fallback(&self, p: Protocol) -> u64 {
        self.fallback[p.index()]
    }

    pub fn prefills(&self, p: Protocol) -> u64 {
        self.prefills[p.index()]
    }

    /// Counts the decision of a decode-side plan; other plans count nothing here.
    pub fn decided(&mut self, plan: &Plan) {
        match plan {
            Plan::Receive(p, _) => self.received[p.index()] += 1,
            Plan::Fallback => self.fallback[Protocol::Vllm.index()] += 1,
            _ => {}
        }
    }

    /// Counts a prefill finished for a decode engine.
    pub fn prefilled(&mut self, p: Protocol) {
        self.prefills[p.index()] += 1;
    }
}

/// The handoff fields of a request body as they stand; `null` reads as absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fields {
    /// vLLM's `kv_transfer_params`.
    pub kv_transfer_params: Option<Value>,
    /// SGLang's prefill bootstrap address and room.
    pub bootstrap_host: Option<Value>,
    pub bootstrap_port: Option<Value>,
    pub bootstrap_room: Option<Value>,
}

impl Fields {
    /// Whether planning needs the prompt text (vLLM's block ids hash it).
    pub fn needs_text(&self) -> bool {
        self.kv_transfer_params.is_some()
    }

    fn bootstrap(&self) -> [(&'static str, Option<&Value>); 3] {
        [
            ("bootstrap_host", self.bootstrap_host.as_ref()),
            ("bootstrap_port", self.bootstrap_port.as_ref()),
            ("bootstrap_room", self.bootstrap_room.as_ref()),
        ]
    }
}

/// How a prefill engine names itself in the `kv_transfer_params` it returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `remote_engine_id`: `mock-` and 16 hex digits, stable for a listen address and seed.
    pub engine_id: String,
    /// `remote_host`: the listen IP.
    pub host: String,
    /// `remote_port`: the listen port (the mock has no separate side channel).
    pub port: u16,
}

impl Identity {
    pub fn new(addr: SocketAddr, seed: u64) -> Identity {
        let mut h = DefaultHasher::new();
        h.write(addr.to_string().as_bytes());
        h.write_u64(seed);
        Identity {
            engine_id: format!("mock-{:016x}", h.finish()),
            host: addr.ip().to_string(),
            port: addr.port(),
        }
    }
}

/// The engine settings a plan depends on.
#[derive(Debug, Clone)]
pub struct Setup {
    pub role: Role,
    pub identity: Identity,
    /// SGLang's bootstrap port of this engine as a prefill worker.
    pub bootstrap_port: u16,
    pub block_size: u32,
}

/// The ids of a prompt's KV blocks on a prefill engine: `count` ids derived from a hash
/// of the engine id and the prompt text, so a decode engine holding the same prompt can
/// recompute them. Each is below 2^31.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockIds {
    key: u64,
    count: u64,
}

impl BlockIds {
    pub fn new(engine_id: &str, text: &[u8], count: u64) -> BlockIds {
        // `DefaultHasher::new()` has fixed keys: every engine computes the same ids.
        let mut h = DefaultHasher::new();
        h.write(engine_id.as_bytes());
        h.write_u8(0xff);
        h.write(text);
        BlockIds {
            key: h.finish(),
            count,
        }
    }

    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The ids, in block order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.count).map(|i| splitmix(self.key ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 33)
    }

    /// Whether `v` is exactly this list of ids.
    fn matches(&self, v: &Value) -> bool {
        let Some(ids) = v.as_array() else {
            return false;
        };
        ids.len() as u64 == self.count && ids.iter().map(Value::as_u64).eq(self.iter().map(Some))
    }
}

/// splitmix64's finalizer.
fn splitmix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What the engine does with a request's prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Prefill here, as any request.
    Local,
    /// vLLM stage 1: prefill here for a decode engine; the response carries
    /// `kv_transfer_params` naming these blocks.
    PrefillVllm(BlockIds),
    /// SGLang on a prefill engine: prefill here and stop at the first token.
    PrefillSglang,
    /// The prompt's KV comes from a prefill engine: `blocks` blocks are transferred, then
    /// the prompt counts as computed.
    Receive(Protocol, u64),
    /// vLLM stage 2 whose transfer params do not check out: prefill here instead.
    Fallback,
}

impl Plan {
    /// The `x-mock-prefill` value: where the prompt was prefilled.
    pub fn prefill(&self) -> &'static str {
        match self {
            Plan::Receive(..) => "remote",
            _ => "local",
        }
    }

    /// The protocol of a prefill run for a decode engine.
    pub fn prefill_for(&self) -> Option<Protocol> {
        match self {
            Plan::PrefillVllm(_) => Some(Protocol::Vllm),
            Plan::PrefillSglang => Some(Protocol::Sglang),
            _ => None,
        }
    }
}

/// Decides what a request's handoff fields ask (the crate's "Disaggregation" rules).
/// `text` is the prompt text (needed when [`Fields::needs_text`]). An error is a 400's
/// message, naming the field.
pub fn plan(
    setup: &Setup,
    fields: &Fields,
    prompt_tokens: u32,
    text: &[u8],
) -> Result<Plan, String> {
    let blocks = u64::from(prompt_tokens).div_ceil(u64::from(setup.block_size.max(1)));
    if let Some(params) = &fields.kv_transfer_params {
        return vllm(setup, params, blocks, text);
    }
    if setup.role == Role::Both || fields.bootstrap().iter().all(|(_, v)| v.is_none()) {
        return Ok(Plan::Local);
    }
    let port = bootstrap(fields)?;
    match setup.role {
        Role::Prefill if port != setup.bootstrap_port => Err(format!(
            "bootstrap_port {port} is not this prefill engine's bootstrap port ({})",
            setup.bootstrap_port
        )),
        Role::Prefill => Ok(Plan::PrefillSglang),
        Role::Decode => Ok(Plan::Receive(Protocol::Sglang, blocks)),
        Role::Both => Ok(Plan::Local),
    }
}

/// vLLM: `do_remote_decode` asks for stage 1, `do_remote_prefill` for stage 2.
fn vllm(setup: &Setup, params: &Value, blocks: u64, text: &[u8]) -> Result<Plan, String> {
    let Some(map) = params.as_object() else {
        return Err("kv_transfer_params must be an object".into());
    };
    let set = |k: &str| map.get(k).and_then(Value::as_bool) == Some(true);
    let wrong_role = |field: &str, role: Role, want: &str| {
        Err(format!(
            "kv_transfer_params.{field} is true, but this engine's role is {role}: send it to a {want} engine"
        ))
    };
    match (set("do_remote_decode"), set("do_remote_prefill")) {
        (true, true) => Err(
            "kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true".into(),
        ),
        (true, false) if setup.role == Role::Decode => {
            wrong_role("do_remote_decode", setup.role, "prefill")
        }
        (true, false) => Ok(Plan::PrefillVllm(BlockIds::new(
            &setup.identity.engine_id,
            text,
            blocks,
        ))),
        (false, true) if setup.role == Role::Prefill => {
            wrong_role("do_remote_prefill", setup.role, "decode")
        }
        (false, true) if transferable(map, blocks, text) => {
            Ok(Plan::Receive(Protocol::Vllm, blocks))
        }
        (false, true) => Ok(Plan::Fallback),
        (false, false) => Ok(Plan::Local),
    }
}

/// Whether stage-2 params name a prefill engine and the blocks it gave this prompt.
fn transferable(map: &serde_json::Map<String, Value>, blocks: u64, text: &[u8]) -> bool {
    let Some(engine_id) = map.get("remote_engine_id").and_then(Value::as_str) else {
        return false;
    };
    let host = map.get("remote_host").is_some_and(Value::is_string);
    let port = map
        .get("remote_port")
        .and_then(Value::as_u64)
        .is_some_and(|p| p <= u64::from(u16::MAX));
    let ids = map
        .get("remote_block_ids")
        .is_some_and(|ids| BlockIds::new(engine_id, text, blocks).matches(ids));
    host && port && ids
}

/// SGLang: all three bootstrap fields, well formed; returns the port.
fn bootstrap(fields: &Fields) -> Result<u16, String> {
    let [host, port, room] = fields.bootstrap().map(|(name, v)| {
        v.ok_or_else(|| {
            format!(
                "{name} is missing: bootstrap_host, bootstrap_port and bootstrap_room go together"
            )
        })
    });
    if host?.as_str().is_none_or(str::is_empty) {
        return Err("bootstrap_host must be a non-empty string".into());
    }
    let port = port?
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or("bootstrap_port must be an integer in 1..=65535")?;
    if room?.as_u64().is_none_or(|r| r >= 1 << 63) {
        return Err("bootstrap_room must be an integer in [0, 2^63)".into());
    }
    Ok(port)
}

/// The `kv_transfer_params` a prefill engine returns (NixlConnector's field set):
/// `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[..],
/// "remote_engine_id":"..","remote_host":"..","remote_port":N,"tp_size":1}`.
pub fn render_params(out: &mut Vec<u8>, ids: &BlockIds, identity: &Identity) {
    out.extend_from_slice(
        br#"{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":["#,
    );
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
    }
    out.extend_from_slice(br#"],"remote_engine_id":"#);
    let _ = serde_json::to_writer(&mut *out, &identity.engine_id);
    out.extend_from_slice(br#","remote_host":"#);
    let _ = serde_json::to_writer(&mut *out, &identity.host);
    let _ = write!(out, r#","remote_port":{},"tp_size":1}}"#, identity.port);
}

#[cfg(test)]
mod tests;
