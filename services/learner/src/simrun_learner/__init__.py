"""The resource learner: observations and resolved requests."""
