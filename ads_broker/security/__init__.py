"""Listeners, TLS and SASL (PLAIN, SCRAM-SHA-256/512): who may connect and as which principal.

Authorization (ACLs) is not here yet; handlers can read the authenticated principal of the
request being handled with :func:`ads_broker.security.context.current_principal`.
"""
