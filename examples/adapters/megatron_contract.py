"""What Megatron-Core's router declares (docs/protocol.md, "The contract in the greeting"),
shared by its adapter (megatron_route.py) and its numpy model (numpy_megatron_route.py).

Scores in f32 (whatever the router's dtype), Megatron's conventions (a group scores the sum of
its top K/TG experts, no sigmoid normalisation at K = 1, torch.topk's ties in no promised
order), every score function, capacity dropping by `probs` or by `token-order` (Megatron's
"position"), groups, a bias and a scaling factor. The combinations Megatron refuses that these
keys cannot say (a bias with a softmax score, norm_topk with softmax, topk-softmax at K = 1)
are refused case by case.
"""

CONTRACT = {
    "route": {
        "declared": {"compute": "f32", "convention": "megatron", "ties": "any"},
        "supports": {
            "scores": ["softmax", "topk-softmax", "sigmoid"],
            "capacity": True,
            "drop_policies": ["probs", "token-order"],
            "groups": True,
            "bias": True,
            "scaling": True,
        },
    },
}
