"""TLS material (to be filled by the certificates issue).

Will own the TLS server context with reload on file change, CA and serving-certificate generation
(``cryptography``) and the webhook caBundle. Must not do anything else.
"""
