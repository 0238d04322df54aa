#!/usr/bin/env bash
# Install the .dmg as a user does (mount it, copy the app out, unmount), run the installed copy (version,
# then the self-test: window, demo pair, one prompt through its own worker), then uninstall it (delete the
# app; user data stays in ~/Library/Application Support/DFlashDesktop). A signed app must also pass
# Gatekeeper's assessment.
set -euo pipefail
cd "$(dirname "$0")/../.."
dmgs=(dist/DFlash-Desktop-*-macOS-*.dmg)
dmg="${dmgs[0]}"
mount=$(mktemp -d)
apps=$(mktemp -d)
hdiutil attach "$dmg" -nobrowse -readonly -mountpoint "$mount"
cp -R "$mount/DFlash Desktop.app" "$apps/"
hdiutil detach "$mount"
app="$apps/DFlash Desktop.app"
exe="$app/Contents/MacOS/dflash-desktop"

"$exe" --version
"$exe" --self-test --timeout 900
if [ -n "${MACOS_SIGNING_IDENTITY:-}" ] && [ -n "${MACOS_CERTIFICATE:-}" ]; then
    codesign --verify --strict --deep --verbose=2 "$app"
    spctl --assess --type execute --verbose "$app"
fi
rm -rf "$app"
test ! -e "$app"
echo "installed, ran and removed $(basename "$dmg")"
