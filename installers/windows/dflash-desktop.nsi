; DFlash Desktop for Windows: a per-user installer (no administrator rights, no UAC prompt).
;
; Built by installers/windows/make_installer.py, which passes:
;   /DVERSION=0.1.0  /DPAYLOAD=<the frozen app folder>  /DOUTFILE=<setup .exe>  /DICON=<.ico>
;   /DSIGN_COMMAND="<command with %1>"  (optional: signs the uninstaller as it is written)
;
; What it does:
;   - installs to %LOCALAPPDATA%\Programs\DFlash Desktop (changeable), Start-menu and desktop shortcuts,
;     an entry in Settings > Apps with a silent uninstall string; no file associations;
;   - an upgrade installs over the old version in place: the old program files go first (so no file of
;     the old version lingers), and the user's chats, settings, models and logs stay, because they are
;     not in the install folder but in %LOCALAPPDATA%\DFlashDesktop and the Hugging Face cache;
;   - the uninstaller removes the program, its shortcuts, its Apps entry and downloaded engine packs
;     (%LOCALAPPDATA%\DFlashDesktop\engine-packs: program code, gigabytes), and keeps chats and models.
; Silent: `Setup.exe /S [/D=folder]`, `uninstall.exe /S`.

Unicode true
Target amd64-unicode
ManifestDPIAware true
RequestExecutionLevel user
SetCompressor /SOLID lzma

!ifndef VERSION
  !error "VERSION is missing: build with installers/windows/make_installer.py"
!endif
!ifndef PAYLOAD
  !error "PAYLOAD is missing: build with installers/windows/make_installer.py"
!endif
!ifndef OUTFILE
  !error "OUTFILE is missing: build with installers/windows/make_installer.py"
!endif
!ifndef ICON
  !error "ICON is missing: build with installers/windows/make_installer.py"
!endif

!define APP "DFlash Desktop"
!define EXE "dflash-desktop.exe"
!define UNINST_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\DFlashDesktop"
!define DATA_DIR "$LOCALAPPDATA\DFlashDesktop"

Name "${APP}"
OutFile "${OUTFILE}"
InstallDir "$LOCALAPPDATA\Programs\${APP}"
InstallDirRegKey HKCU "${UNINST_KEY}" "InstallLocation"
BrandingText "${APP} ${VERSION}"

!ifdef SIGN_COMMAND
  !uninstfinalize '${SIGN_COMMAND}'
!endif

VIProductVersion "${VERSION}.0"
VIAddVersionKey "ProductName" "${APP}"
VIAddVersionKey "ProductVersion" "${VERSION}"
VIAddVersionKey "FileVersion" "${VERSION}"
VIAddVersionKey "FileDescription" "${APP} installer"
VIAddVersionKey "LegalCopyright" "Apache-2.0"

!include "MUI2.nsh"
!define MUI_ICON "${ICON}"
!define MUI_UNICON "${ICON}"
!define MUI_ABORTWARNING
!define MUI_FINISHPAGE_RUN "$INSTDIR\${EXE}"
!define MUI_FINISHPAGE_RUN_TEXT "Start ${APP}"
!define MUI_UNCONFIRMPAGE_TEXT_TOP "${APP} will be removed from your computer. Your chats, settings and downloaded models are kept (in ${DATA_DIR} and the Hugging Face cache); downloaded engine packs are removed."
!insertmacro MUI_PAGE_WELCOME
!insertmacro MUI_PAGE_DIRECTORY
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH
!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_INSTFILES
!insertmacro MUI_LANGUAGE "English"

; A running copy locks its .exe: ask the user to close it (silent installs fail with exit code 2 instead).
!macro WaitUntilClosed UN
Function ${UN}WaitUntilClosed
  retry:
    IfFileExists "$INSTDIR\${EXE}" 0 done
    ClearErrors
    FileOpen $0 "$INSTDIR\${EXE}" a
    IfErrors 0 closed
    IfSilent 0 +3
      SetErrorLevel 2
      Quit
    MessageBox MB_RETRYCANCEL|MB_ICONEXCLAMATION "${APP} is running. Close it, then choose Retry." IDRETRY retry
    Quit
  closed:
    FileClose $0
  done:
FunctionEnd
!macroend
!insertmacro WaitUntilClosed ""
!insertmacro WaitUntilClosed "un."

; Only what the installer put there: never a recursive delete of a folder the user may have chosen.
!macro RemoveProgramFiles
  RMDir /r "$INSTDIR\_internal"
  Delete "$INSTDIR\${EXE}"
!macroend

Section "Install"
  Call WaitUntilClosed
  SetOutPath "$INSTDIR"
  !insertmacro RemoveProgramFiles   ; an upgrade: the old version's files go, the user's data is elsewhere
  File /r "${PAYLOAD}\*"
  WriteUninstaller "$INSTDIR\uninstall.exe"

  SetShellVarContext current
  CreateShortcut "$SMPROGRAMS\${APP}.lnk" "$INSTDIR\${EXE}" "" "$INSTDIR\${EXE}" 0
  CreateShortcut "$DESKTOP\${APP}.lnk" "$INSTDIR\${EXE}" "" "$INSTDIR\${EXE}" 0

  WriteRegStr HKCU "${UNINST_KEY}" "DisplayName" "${APP}"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINST_KEY}" "Publisher" "DFlash Desktop"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayIcon" "$INSTDIR\${EXE}"
  WriteRegStr HKCU "${UNINST_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINST_KEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr HKCU "${UNINST_KEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoRepair" 1
  SectionGetSize 0 $0
  WriteRegDWORD HKCU "${UNINST_KEY}" "EstimatedSize" $0
SectionEnd

Section "Uninstall"
  Call un.WaitUntilClosed
  !insertmacro RemoveProgramFiles
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR"   ; only if empty

  SetShellVarContext current
  Delete "$SMPROGRAMS\${APP}.lnk"
  Delete "$DESKTOP\${APP}.lnk"
  RMDir /r "${DATA_DIR}\engine-packs"
  DeleteRegKey HKCU "${UNINST_KEY}"
SectionEnd
