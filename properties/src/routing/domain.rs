//! What a router declares about the cases it runs ([`RouteDomain`]): the conventions that
//! change the case (its group score, its sigmoid normalisation at `K = 1`, its tie rule, or a
//! public router's convention that sets all three) and the features it supports (score
//! functions, capacity dropping and its policies, groups, a bias, a scaling factor, the
//! number of experts). The MoE layer's routing reads the same declaration
//! ([`RouteDomain::fit_config`]).

use moecheck_reference::routing::{
    Convention, DropPolicy, GroupScore, RoutingConfig, ScoreFunction, SigmoidNorm, SlotOrder, Ties,
};

use super::strategies::{LogitPattern, RouteArgs};
use crate::coverage::edges_hit;

/// A router's declared contract; the default declares nothing (every drawn case as drawn).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteDomain {
    /// A public router's conventions: the default of the three below.
    pub convention: Option<Convention>,
    pub group_score: Option<GroupScore>,
    pub sigmoid_norm: Option<SigmoidNorm>,
    pub ties: Option<Ties>,
    /// The order of a token's slots it writes (`None`: by score).
    pub slot_order: Option<SlotOrder>,
    /// Score functions it runs (`None`: all).
    pub scores: Option<Vec<ScoreFunction>>,
    /// Whether it drops assignments over capacity (`None`: yes).
    pub capacity: Option<bool>,
    /// Drop policies it implements (`None`: all).
    pub drop_policies: Option<Vec<DropPolicy>>,
    /// Whether it implements group-limited selection, a selection bias, a scaling factor
    /// other than 1 (`None`: yes).
    pub groups: Option<bool>,
    pub bias: Option<bool>,
    pub scaling: Option<bool>,
    /// Most experts (`None`: no limit).
    pub max_experts: Option<usize>,
}

fn names<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str) -> String {
    all.iter().map(|&x| name(x)).collect::<Vec<_>>().join(", ")
}

impl RouteDomain {
    /// The declared group score, sigmoid normalisation (for a router with `norm_topk_prob` =
    /// `norm_topk`) and tie rule (each `None` where neither it nor the convention declares it).
    pub fn conventions(
        &self,
        norm_topk: bool,
    ) -> (Option<GroupScore>, Option<SigmoidNorm>, Option<Ties>) {
        let c = self.convention;
        (
            self.group_score.or(c.map(Convention::group_score)),
            self.sigmoid_norm
                .or(c.map(|c| c.sigmoid_norm_for(norm_topk))),
            self.ties.or(c.map(Convention::ties)),
        )
    }

    /// The declared slot order, or the convention's.
    pub fn slot_order(&self) -> Option<SlotOrder> {
        self.slot_order
            .or(self.convention.map(Convention::slot_order))
    }

    /// The declared score functions, or the one a Hugging Face family always uses.
    pub fn scores(&self) -> Option<Vec<ScoreFunction>> {
        self.scores
            .clone()
            .or(self.convention.and_then(Convention::score).map(|s| vec![s]))
    }

    /// `cfg` (with `experts` experts and a bias or not) inside this domain, or why not.
    pub fn fit_config(
        &self,
        cfg: &RoutingConfig,
        experts: usize,
        bias: bool,
    ) -> Result<RoutingConfig, String> {
        let mut cfg = *cfg;
        if let Some(scores) = &self.scores() {
            if !scores.contains(&cfg.score) {
                return Err(format!(
                    "score {} (declared scores: {})",
                    cfg.score.name(),
                    names(scores, ScoreFunction::name)
                ));
            }
        }
        if let Some(cap) = &cfg.capacity {
            if self.capacity == Some(false) {
                return Err("capacity dropping (declared: none)".into());
            }
            if let Some(policies) = &self.drop_policies {
                if !policies.contains(&cap.policy) {
                    return Err(format!(
                        "drop policy {} (declared drop policies: {})",
                        cap.policy.name(),
                        names(policies, DropPolicy::name)
                    ));
                }
            }
        }
        if cfg.groups.is_some() && self.groups == Some(false) {
            return Err("group-limited selection (declared: none)".into());
        }
        if bias && self.bias == Some(false) {
            return Err("a selection bias (declared: none)".into());
        }
        if cfg.scaling_factor != 1.0 && self.scaling == Some(false) {
            return Err(format!(
                "scaling factor {} (declared: none)",
                cfg.scaling_factor
            ));
        }
        if let Some(max) = self.max_experts {
            if experts > max {
                return Err(format!("{experts} experts (declared maximum {max})"));
            }
        }
        let (group_score, sigmoid_norm, ties) = self.conventions(cfg.norm_topk);
        cfg.group_score = group_score.unwrap_or(cfg.group_score);
        cfg.sigmoid_norm = sigmoid_norm.unwrap_or(cfg.sigmoid_norm);
        cfg.ties = ties.unwrap_or(cfg.ties);
        cfg.slot_order = self.slot_order().unwrap_or(cfg.slot_order);
        if self.convention.is_some_and(Convention::always_norm_topk) {
            cfg.norm_topk = true;
        }
        if cfg.slot_order == SlotOrder::Any
            && cfg
                .capacity
                .is_some_and(|c| c.policy == DropPolicy::Position)
        {
            return Err(
                "drop policy position under slot order any (it ranks a token's assignments by slot)"
                    .into(),
            );
        }
        if let Some(limit) = cfg.groups {
            // Megatron's group score sums the top K/TG scores of a group: at least one.
            if cfg.group_score == GroupScore::TopKPerGroup && cfg.topk < limit.topk_groups {
                return Err(format!(
                    "K = {} below TG = {} under group score top-k-per-group",
                    cfg.topk, limit.topk_groups
                ));
            }
        }
        Ok(cfg)
    }

    /// `args` inside this domain, or why not.
    pub fn fit(&self, args: &RouteArgs) -> Result<RouteArgs, String> {
        let cfg = self.fit_config(&args.config(), args.experts, args.bias_max.is_some())?;
        Ok(RouteArgs {
            group_score: cfg.group_score,
            sigmoid_norm: cfg.sigmoid_norm,
            ties: cfg.ties,
            slot_order: cfg.slot_order,
            ..args.clone()
        })
    }

    /// Why the routing property `name` does not apply here.
    pub fn relaxed(&self, name: &str) -> Option<String> {
        let (_, _, ties) = self.conventions(false);
        match name {
            "ties-to-lower-index" if ties == Some(Ties::Any) => Some(
                "the implementation declares ties any: any choice among equal scores is valid"
                    .into(),
            ),
            "ties-to-lower-index" if self.slot_order() == Some(SlotOrder::Any) => Some(
                "the implementation declares slot order any: the order of equal scores' slots is not its contract"
                    .into(),
            ),
            "capacity-survivors" | "no-renormalisation" if self.capacity == Some(false) => {
                Some("the implementation declares no capacity dropping".into())
            }
            "group-limited-selection" if self.groups == Some(false) => {
                Some("the implementation declares no group-limited selection".into())
            }
            "weights-from-prebias-scores" if self.bias == Some(false) => {
                Some("the implementation declares no selection bias".into())
            }
            _ => None,
        }
    }
}

/// The routing edge classes, in report order.
const N_EDGES: usize = 12;

/// The edge classes, in report order.
pub const EDGES: &[&str; N_EDGES] = &[
    "no-tokens",
    "one-token",
    "one-expert",
    "k-equals-e",
    "ties",
    "groups",
    "capacity-dropping",
    "bias",
    "score-softmax",
    "score-topk-softmax",
    "score-sigmoid",
    "scaling-factor",
];

/// The edge classes `a` exercises.
pub fn edges(a: &RouteArgs) -> Vec<&'static str> {
    let conditions = [
        a.tokens == 0,
        a.tokens == 1,
        a.experts == 1,
        a.topk == a.experts,
        matches!(a.logits, LogitPattern::FewValues | LogitPattern::Equal),
        a.groups.is_some(),
        a.capacity.is_some(),
        a.bias_max.is_some(),
        a.score == ScoreFunction::Softmax,
        a.score == ScoreFunction::TopkSoftmax,
        a.score == ScoreFunction::Sigmoid,
        a.scaling_factor != 1.0,
    ];
    edges_hit(EDGES, conditions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::strategies::{route_args, RouteRequire};
    use moecheck_reference::op::Op;
    use moecheck_reference::routing::Route;
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    fn drawn(n: usize) -> Vec<RouteArgs> {
        let mut runner = TestRunner::deterministic();
        let s = route_args(RouteRequire::default());
        (0..n)
            .map(|_| s.new_tree(&mut runner).unwrap().current())
            .collect()
    }

    /// Megatron-Core's router as its adapter declares it: every fitted case is valid, follows
    /// the convention and stays inside the supported features.
    #[test]
    fn a_megatron_router_draws_inside_its_convention() {
        let d = RouteDomain {
            convention: Some(Convention::Megatron),
            scores: Some(vec![ScoreFunction::Softmax, ScoreFunction::Sigmoid]),
            drop_policies: Some(vec![DropPolicy::Probs, DropPolicy::TokenOrder]),
            bias: Some(false),
            ..RouteDomain::default()
        };
        let (mut inside, mut outside) = (0, 0);
        for a in drawn(400) {
            match d.fit(&a) {
                Ok(f) => {
                    inside += 1;
                    assert_eq!(f.group_score, GroupScore::TopKPerGroup);
                    assert_eq!((f.sigmoid_norm, f.ties), (SigmoidNorm::SkipK1, Ties::Any));
                    assert!(f.score != ScoreFunction::TopkSoftmax && f.bias_max.is_none());
                    assert!(f.capacity.is_none_or(|c| c.1 != DropPolicy::Position));
                    let case = f.build();
                    assert_eq!(case.config.ties, Ties::Any);
                    Route::validate(&case, ()).unwrap_or_else(|e| panic!("{f:?}: {e}"));
                }
                Err(why) => {
                    outside += 1;
                    assert!(
                        why.contains("declared") || why.contains("below TG"),
                        "{why}"
                    );
                }
            }
        }
        assert!(
            inside > 100 && outside > 50,
            "{inside} inside, {outside} outside"
        );
        assert_eq!(
            RouteDomain::default().fit(&drawn(1)[0]),
            Ok(drawn(1)[0].clone())
        );
    }

    #[test]
    fn properties_a_declaration_relaxes() {
        let d = RouteDomain {
            ties: Some(Ties::Any),
            capacity: Some(false),
            groups: Some(false),
            bias: Some(false),
            ..RouteDomain::default()
        };
        for name in [
            "ties-to-lower-index",
            "capacity-survivors",
            "no-renormalisation",
            "group-limited-selection",
            "weights-from-prebias-scores",
        ] {
            assert!(d.relaxed(name).is_some(), "{name}");
            assert_eq!(RouteDomain::default().relaxed(name), None, "{name}");
        }
        assert_eq!(d.relaxed("route-matches-reference"), None);
        let megatron = RouteDomain {
            convention: Some(Convention::Megatron),
            ..RouteDomain::default()
        };
        assert!(megatron.relaxed("ties-to-lower-index").is_some());
    }
}
