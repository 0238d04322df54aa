#!/usr/bin/env bash
# Sign "dist/DFlash Desktop.app" with a Developer ID certificate and the hardened runtime, inside out
# (every Mach-O library and program first, the app last), as notarization requires. Apple advises against
# `codesign --deep`, which signs nested code without its own options.
#   MACOS_CERTIFICATE (base64 .p12), MACOS_CERTIFICATE_PASSWORD, MACOS_SIGNING_IDENTITY ("Developer ID
#   Application: Name (TEAMID)"). Without them it prints a notice and leaves the app unsigned (ad hoc).
set -euo pipefail
cd "$(dirname "$0")/../.."
APP="dist/DFlash Desktop.app"
ENTITLEMENTS="installers/macos/entitlements.plist"

if [ -z "${MACOS_CERTIFICATE:-}" ] || [ -z "${MACOS_SIGNING_IDENTITY:-}" ]; then
    echo "::notice::MACOS_CERTIFICATE / MACOS_SIGNING_IDENTITY not set: the app is not signed (Gatekeeper will warn)"
    exit 0
fi

keychain="$RUNNER_TEMP/signing.keychain-db"
password="$(uuidgen)"
echo "$MACOS_CERTIFICATE" | base64 --decode > "$RUNNER_TEMP/certificate.p12"
security create-keychain -p "$password" "$keychain"
security set-keychain-settings -lut 21600 "$keychain"
security unlock-keychain -p "$password" "$keychain"
security import "$RUNNER_TEMP/certificate.p12" -P "$MACOS_CERTIFICATE_PASSWORD" -A -t cert -f pkcs12 -k "$keychain"
security set-key-partition-list -S apple-tool:,apple: -k "$password" "$keychain" >/dev/null
security list-keychains -d user -s "$keychain" "$HOME/Library/Keychains/login.keychain-db"
rm "$RUNNER_TEMP/certificate.p12"

sign() { codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" --sign "$MACOS_SIGNING_IDENTITY" "$@"; }
# every Mach-O file except the main program, deepest first
find "$APP/Contents" -type f ! -path "*/Contents/MacOS/*" -print0 | while IFS= read -r -d '' f; do
    if file -b "$f" | grep -q "Mach-O"; then sign "$f"; fi
done
sign "$APP"
codesign --verify --strict --deep --verbose=2 "$APP"
echo "signed $APP as $MACOS_SIGNING_IDENTITY"
