#!/usr/bin/env bash
# Send the signed .dmg to Apple's notary service, wait for the verdict and staple the ticket to the image,
# so Gatekeeper opens it without a network check. Needs APPLE_ID, APPLE_TEAM_ID and APPLE_APP_PASSWORD (an
# app-specific password); without them, or without a signed app, it prints a notice and does nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${APPLE_ID:-}" ] || [ -z "${APPLE_TEAM_ID:-}" ] || [ -z "${APPLE_APP_PASSWORD:-}" ] \
        || [ -z "${MACOS_SIGNING_IDENTITY:-}" ]; then
    echo "::notice::APPLE_ID / APPLE_TEAM_ID / APPLE_APP_PASSWORD or the signing identity not set: not notarized"
    exit 0
fi
for dmg in dist/DFlash-Desktop-*-macOS-*.dmg; do
    xcrun notarytool submit "$dmg" --apple-id "$APPLE_ID" --team-id "$APPLE_TEAM_ID" \
        --password "$APPLE_APP_PASSWORD" --wait
    xcrun stapler staple "$dmg"
    xcrun stapler validate "$dmg"
done
