//! An implementation's declared contract for one operation (docs/protocol.md, "The
//! contract"): what it declares (`declared`: its accumulator, its tail rule, its routing
//! convention, ...) and the domain it supports (`supports`: dtypes, passes, shapes,
//! features). A worker sends it in its greeting, keyed by op (`grouped_gemm`, `fp8`, `route`,
//! `moe_layer`); `moecheck prop`'s flags give the same keys and replace the greeting's value
//! key by key. Each operation reads its keys into its property domain
//! ([`moecheck_properties::PropertyOp::Domain`]) and its precision declaration
//! ([`Declared`]) through [`Contracted`]; a key it does not read, or a value of the wrong
//! kind, is a one-line error naming the key and where it came from (exit 2).

use std::collections::BTreeMap;

use serde_json::Value;

use moecheck_properties::gemm::GemmDomain;
use moecheck_properties::moe::MoeDomain;
use moecheck_properties::routing::RouteDomain;
use moecheck_properties::PropertyOp;
use moecheck_reference::format::Format;
use moecheck_reference::gemm::{Passes, TailContract};
use moecheck_reference::moe::ffn::Activation;
use moecheck_reference::routing::{
    Convention, DropPolicy, GroupScore, ScoreFunction, SigmoidNorm, SlotOrder, Ties,
};

use crate::protocol::Declared;

/// Where a key's value came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The worker's greeting.
    Greeting,
    /// A command-line flag (its name, `--tail`).
    Flag(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Greeting => f.write_str("the worker's greeting"),
            Source::Flag(flag) => f.write_str(flag),
        }
    }
}

/// The two sections of a contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    Declared,
    Supports,
}

impl Section {
    fn name(self) -> &'static str {
        match self {
            Section::Declared => "declared",
            Section::Supports => "supports",
        }
    }
}

/// One operation's contract: each key's value and where it came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Contract {
    entries: BTreeMap<(Section, String), (Value, Source)>,
}

impl Contract {
    /// The contract a greeting declares for one op (its `"contract"` entry for that op, or
    /// `None`): an object with `declared` and `supports` objects, both optional.
    pub fn from_greeting(op_key: &str, entry: Option<&Value>) -> Result<Contract, String> {
        let mut c = Contract::default();
        let Some(entry) = entry else {
            return Ok(c);
        };
        let at = format!("the worker's greeting, contract.{op_key}");
        let Value::Object(sections) = entry else {
            return Err(format!(
                "{at}: expected an object with \"declared\" and \"supports\""
            ));
        };
        for (name, body) in sections {
            let section = match name.as_str() {
                "declared" => Section::Declared,
                "supports" => Section::Supports,
                _ => {
                    return Err(format!(
                        "{at}.{name}: expected \"declared\" or \"supports\""
                    ))
                }
            };
            let Value::Object(keys) = body else {
                return Err(format!("{at}.{name}: expected an object"));
            };
            for (key, value) in keys {
                if !value.is_null() {
                    c.entries
                        .insert((section, key.clone()), (value.clone(), Source::Greeting));
                }
            }
        }
        Ok(c)
    }

    /// Sets `section.key` to `value`, given by `flag`.
    pub fn set(&mut self, section: Section, key: &str, value: Value, flag: &str) {
        self.entries.insert(
            (section, key.to_string()),
            (value, Source::Flag(flag.to_string())),
        );
    }

    /// `self` with every key `flags` gives replaced by the flag's value.
    pub fn overridden_by(mut self, flags: &Contract) -> Contract {
        for (k, v) in &flags.entries {
            self.entries.insert(k.clone(), v.clone());
        }
        self
    }

    /// Whether nothing is declared.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Reads this contract for `op` (its contract key).
    pub fn reader<'a>(&'a self, op: &'a str) -> Reader<'a> {
        Reader {
            contract: self,
            op,
            read: Vec::new(),
        }
    }

    /// Every key as `section.key = value (source)`, for the report.
    pub fn lines(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|((s, k), (v, src))| format!("{}.{k} = {v} ({src})", s.name()))
            .collect()
    }
}

/// Typed access to a contract's keys, each error naming the key and its source; [`Reader::finish`]
/// refuses the keys nobody read.
pub struct Reader<'a> {
    contract: &'a Contract,
    op: &'a str,
    read: Vec<(Section, String)>,
}

impl Reader<'_> {
    fn raw(&mut self, section: Section, key: &str) -> Option<&(Value, Source)> {
        self.read.push((section, key.to_string()));
        self.contract.entries.get(&(section, key.to_string()))
    }

    fn wrong(
        &self,
        section: Section,
        key: &str,
        src: &Source,
        value: &Value,
        want: &str,
    ) -> String {
        format!(
            "{src}: contract.{}.{}.{key} = {value}: expected {want}",
            self.op,
            section.name()
        )
    }

    /// A string key parsed by `parse` (whose error names what it expected).
    pub fn parsed<T>(
        &mut self,
        section: Section,
        key: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        let Some((value, src)) = self.raw(section, key).cloned() else {
            return Ok(None);
        };
        let text = value
            .as_str()
            .ok_or_else(|| self.wrong(section, key, &src, &value, "a string"))?;
        parse(text)
            .map(Some)
            .map_err(|why| self.wrong(section, key, &src, &value, &why))
    }

    /// A list of strings (a JSON list, or one comma-separated string), each parsed.
    pub fn list<T>(
        &mut self,
        section: Section,
        key: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<Vec<T>>, String> {
        let Some((value, src)) = self.raw(section, key).cloned() else {
            return Ok(None);
        };
        let items: Vec<String> = match &value {
            Value::Array(a) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| self.wrong(section, key, &src, &value, "a list of names"))?,
            Value::String(s) => s.split(',').map(|p| p.trim().to_string()).collect(),
            _ => return Err(self.wrong(section, key, &src, &value, "a list of names")),
        };
        if items.is_empty() {
            return Err(self.wrong(section, key, &src, &value, "at least one name"));
        }
        items
            .iter()
            .map(|i| parse(i).map_err(|why| self.wrong(section, key, &src, &value, &why)))
            .collect::<Result<Vec<T>, String>>()
            .map(Some)
    }

    /// A non-negative integer at least `min`.
    pub fn count(
        &mut self,
        section: Section,
        key: &str,
        min: u64,
    ) -> Result<Option<usize>, String> {
        let Some((value, src)) = self.raw(section, key).cloned() else {
            return Ok(None);
        };
        match value.as_u64() {
            Some(n) if n >= min => Ok(Some(n as usize)),
            _ => Err(self.wrong(
                section,
                key,
                &src,
                &value,
                &format!("an integer of at least {min}"),
            )),
        }
    }

    /// `true` or `false`.
    pub fn flag(&mut self, section: Section, key: &str) -> Result<Option<bool>, String> {
        let Some((value, src)) = self.raw(section, key).cloned() else {
            return Ok(None);
        };
        value
            .as_bool()
            .map(Some)
            .ok_or_else(|| self.wrong(section, key, &src, &value, "true or false"))
    }

    /// An error for the first key nobody read, naming the keys this operation reads.
    pub fn finish(self) -> Result<(), String> {
        let unread = self
            .contract
            .entries
            .iter()
            .find(|(k, _)| !self.read.contains(k));
        let Some(((section, key), (_, src))) = unread else {
            return Ok(());
        };
        let known: Vec<&str> = self
            .read
            .iter()
            .filter(|(s, _)| s == section)
            .map(|(_, k)| k.as_str())
            .collect();
        Err(format!(
            "{src}: contract.{}.{}.{key}: op {} has no such key (it reads {})",
            self.op,
            section.name(),
            self.op,
            known.join(", ")
        ))
    }
}

/// A format name (`f32`, `bf16`, ...).
pub fn format(s: &str) -> Result<Format, String> {
    Format::parse(s).map_err(|_| "a format name (f32, bf16, f16, ...)".to_string())
}

/// `supports.passes`: every pass the list names (`["fwd", "wgrad"]`, or `"fwd,wgrad"`).
fn passes(r: &mut Reader) -> Result<Option<Passes>, String> {
    let lists = r.list(Section::Supports, "passes", Passes::parse)?;
    Ok(lists.map(|lists| {
        let mut all = Passes::default();
        lists
            .iter()
            .flat_map(|p| p.iter())
            .for_each(|x| all.insert(x));
        all
    }))
}

/// What an operation reads from a contract.
pub trait Contracted: PropertyOp {
    /// Its key in a greeting's `"contract"` (`grouped_gemm`, `fp8`, `route`, `moe_layer`).
    const CONTRACT_KEY: &'static str;

    /// Its domain and precision declaration from `c`.
    fn read_contract(c: &Contract) -> Result<(Self::Domain, Declared), String>;

    /// The domain of an implementation outside moecheck (`exec:`, `worker:`): what it does
    /// not declare of the features it must opt into is off (the identity for most ops).
    fn external(domain: Self::Domain) -> Self::Domain {
        domain
    }
}

/// The precision keys every external implementation of an op with them declares: `acc`,
/// `acc_block`, `compute`, `out_dtype`, `router_compute` (a format; `input` is read by the op
/// itself).
fn precision(r: &mut Reader, keys: &[&str]) -> Result<Declared, String> {
    let mut d = Declared::default();
    for key in keys {
        match *key {
            "acc" => d.acc = r.parsed(Section::Declared, "acc", format)?,
            "acc_block" => d.acc_block = r.count(Section::Declared, "acc_block", 1)?,
            "compute" => d.compute = r.parsed(Section::Declared, "compute", format)?,
            "out_dtype" => d.out_dtype = r.parsed(Section::Declared, "out_dtype", format)?,
            "router_compute" => {
                d.router_compute = r.parsed(Section::Declared, "router_compute", format)?
            }
            _ => unreachable!("not a precision key: {key}"),
        }
    }
    Ok(d)
}

impl Contracted for moecheck_reference::gemm::Gemm {
    const CONTRACT_KEY: &'static str = "grouped_gemm";

    fn read_contract(c: &Contract) -> Result<(GemmDomain, Declared), String> {
        let mut r = c.reader(Self::CONTRACT_KEY);
        let mut d = GemmDomain::default();
        let out_is_input = r.parsed(Section::Declared, "out_dtype", |s| match s {
            "input" => Ok(None),
            s => format(s)
                .map(Some)
                .map_err(|_| "a format name or input".to_string()),
        })?;
        let mut declared = precision(&mut r, &["acc", "acc_block"])?;
        match out_is_input {
            Some(None) => d.out_is_input = true,
            Some(Some(f)) => declared.out_dtype = Some(f),
            None => {}
        }
        if let Some(tail) = r.parsed(Section::Declared, "tail", |s| match s {
            "zero" => Ok(TailContract::Zero),
            "ignored" => Ok(TailContract::Ignored),
            _ => Err("zero or ignored".into()),
        })? {
            d.tail = tail;
        }
        d.dtypes = r.list(Section::Supports, "dtypes", |s| match format(s)? {
            f @ (Format::Bf16 | Format::F16 | Format::F32) => Ok(f),
            _ => Err("input dtypes among f32, bf16, f16".into()),
        })?;
        if let Some(p) = passes(&mut r)? {
            d.passes = p;
        }
        let count = |r: &mut Reader, key: &str, min: u64, into: &mut usize| {
            if let Some(n) = r.count(Section::Supports, key, min)? {
                *into = n;
            }
            Ok::<(), String>(())
        };
        count(&mut r, "k_min", 0, &mut d.k_min)?;
        count(&mut r, "n_min", 0, &mut d.n_min)?;
        count(&mut r, "k_multiple", 1, &mut d.k_multiple)?;
        count(&mut r, "n_multiple", 1, &mut d.n_multiple)?;
        count(&mut r, "m_multiple", 1, &mut d.m_multiple)?;
        d.max_experts = r.count(Section::Supports, "max_experts", 1)?;
        r.finish()?;
        Ok((d, declared))
    }
}

impl Contracted for moecheck_reference::fp8::Fp8Gemm {
    const CONTRACT_KEY: &'static str = "fp8";

    /// FP8 declares its recipe in each case (`--accum`, the scaling flags are the case's),
    /// so its contract reads only the passes, and every one must be there for now.
    fn read_contract(c: &Contract) -> Result<((), Declared), String> {
        let mut r = c.reader(Self::CONTRACT_KEY);
        if let Some(all) = passes(&mut r)? {
            if all != Passes::ALL {
                return Err(format!(
                    "contract.fp8.supports.passes = {all}: campaigns of op fp8 need every pass (fwd, dgrad, wgrad)"
                ));
            }
        }
        r.finish()?;
        Ok(((), Declared::default()))
    }
}

/// One of `all` by its name (`name`), or the names to expect.
fn named<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str, s: &str) -> Result<T, String> {
    all.iter().copied().find(|&x| name(x) == s).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|&x| name(x)).collect();
        format!("one of {}", names.join(", "))
    })
}

/// A router's keys (the route op's, and the MoE layer's routing).
fn route_domain(r: &mut Reader) -> Result<RouteDomain, String> {
    use Section::{Declared as D, Supports as S};
    const POLICIES: [DropPolicy; 3] = [
        DropPolicy::Position,
        DropPolicy::Probs,
        DropPolicy::TokenOrder,
    ];
    Ok(RouteDomain {
        convention: r.parsed(D, "convention", |s| {
            named(&Convention::ALL, Convention::name, s)
        })?,
        group_score: r.parsed(D, "group_score", |s| {
            named(&GroupScore::ALL, GroupScore::name, s)
        })?,
        sigmoid_norm: r.parsed(D, "sigmoid_norm", |s| {
            named(&SigmoidNorm::ALL, SigmoidNorm::name, s)
        })?,
        ties: r.parsed(D, "ties", |s| named(&Ties::ALL, Ties::name, s))?,
        slot_order: r.parsed(D, "slot_order", |s| {
            named(&SlotOrder::ALL, SlotOrder::name, s)
        })?,
        scores: r.list(S, "scores", |s| {
            named(&ScoreFunction::ALL, ScoreFunction::name, s)
        })?,
        capacity: r.flag(S, "capacity")?,
        drop_policies: r.list(S, "drop_policies", |s| {
            named(&POLICIES, DropPolicy::name, s)
        })?,
        groups: r.flag(S, "groups")?,
        bias: r.flag(S, "bias")?,
        scaling: r.flag(S, "scaling")?,
        max_experts: r.count(S, "max_experts", 1)?,
    })
}

impl Contracted for moecheck_reference::routing::Route {
    const CONTRACT_KEY: &'static str = "route";

    fn read_contract(c: &Contract) -> Result<(RouteDomain, Declared), String> {
        let mut r = c.reader(Self::CONTRACT_KEY);
        let declared = precision(&mut r, &["compute"])?;
        let domain = route_domain(&mut r)?;
        r.finish()?;
        Ok((domain, declared))
    }
}

impl Contracted for moecheck_reference::moe::MoeLayer {
    const CONTRACT_KEY: &'static str = "moe_layer";

    fn read_contract(c: &Contract) -> Result<(MoeDomain, Declared), String> {
        let mut r = c.reader(Self::CONTRACT_KEY);
        let declared = precision(&mut r, &["compute", "out_dtype", "router_compute"])?;
        let domain = MoeDomain {
            route: route_domain(&mut r)?,
            dtypes: r.list(Section::Supports, "dtypes", |s| match format(s)? {
                f @ (Format::Bf16 | Format::F16 | Format::F32) => Ok(f),
                _ => Err("input dtypes among f32, bf16, f16".into()),
            })?,
            shared_expert: r.flag(Section::Supports, "shared_expert")?,
            shared_gate: r.flag(Section::Supports, "shared_gate")?,
            activations: r.list(Section::Supports, "activations", |s| {
                named(&Activation::ALL, Activation::name, s)
            })?,
            expert_bias: r.flag(Section::Supports, "expert_bias")?,
            router_bias: r.flag(Section::Supports, "router_bias")?,
        };
        r.finish()?;
        Ok((domain, declared))
    }

    /// A gated shared expert, the clamped activation and the expert and router biases are
    /// drawn only for an external implementation that declares them (`supports`).
    fn external(domain: MoeDomain) -> MoeDomain {
        domain.external()
    }
}

#[cfg(test)]
#[path = "contract_tests.rs"]
mod tests;
