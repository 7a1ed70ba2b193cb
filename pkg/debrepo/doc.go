// Package debrepo is the packages half of `appliance bundle create`: it checks upstream Debian
// repositories, resolves the packages a node needs the way apt resolves them, and writes the bundle's
// own signed Debian repository.
//
// Three pieces:
//
//  1. FetchIndex verifies one upstream source the way apt-secure(8) does: it fetches InRelease (or
//     Release and Release.gpg) over HTTP(S), checks the OpenPGP signature (RFC 4880, RFC 9580)
//     against the source's own keyring only (sources.list(5) Signed-By), refuses an expired Release
//     (Valid-Until), then fetches the Packages index of every component, checks its size and SHA-256
//     against the signed Release and parses it.
//  2. Resolve drives the real apt-get with a private configuration (its own sources.list, lists,
//     caches and an EMPTY dpkg status, none of the host's apt configuration) so that apt itself
//     computes the Depends/Pre-Depends closure for a node that starts with nothing installed, and
//     downloads and verifies the .debs into a cache directory that reruns reuse.
//  3. BuildRepo lays .debs out as a Debian repository (pool/, dists/<suite>/<component>/binary-<arch>/
//     Packages and Packages.gz, dists/<suite>/Release) and signs it (InRelease clear-signed,
//     Release.gpg detached and armored) with a key from EnsureRepoKey, whose public half
//     (Signer.PublicKeyring) is the binary keyring apt's signed-by= names.
//
// The repository format is the one described at https://wiki.debian.org/DebianRepository/Format:
// a Release file (deb822) lists every index file below dists/<suite>/ with its size and SHA-256;
// each Packages paragraph names its .deb (Filename, relative to the repository root) with its Size
// and SHA256. apt trusts the chain Release signature → Release hashes → Packages hashes → .deb.
package debrepo
