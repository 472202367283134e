"""Command-line tools shaped like AWS Neuron's: ``neuron-ls`` (:mod:`.ls`) and ``neuron-top`` (:mod:`.top`)."""
