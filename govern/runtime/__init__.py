"""The runtime: the shared event log, replicas, the delivery rules they obey, agents as producers.

Layer 5: what runs on a built (and possibly certified) machine.
May import: govern._errors, govern.model, govern.verify, govern.oracle, govern.machine, govern.certificate.
"""
