package ctl

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// bashCompletion asks seinectl itself for the candidates (urfave/cli's
// --generate-bash-completion): subcommands, flags, table names.
const bashCompletion = `# seinectl completion for bash: source <(seinectl completion bash)
_seinectl_complete() {
  local cur="${COMP_WORDS[COMP_CWORD]}"
  local words=("${COMP_WORDS[@]:0:COMP_CWORD}")
  if [[ "$cur" == -* ]]; then words+=("$cur"); fi
  local IFS=$'\n'
  COMPREPLY=($(compgen -W "$("${words[@]}" --generate-bash-completion 2>/dev/null)" -- "$cur"))
  return 0
}
complete -o default -F _seinectl_complete seinectl
`

const zshCompletion = `# seinectl completion for zsh: source <(seinectl completion zsh)
autoload -U +X bashcompinit && bashcompinit
` + bashCompletion

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		ArgsUsage: "bash|zsh|fish",
		Usage:     "print a shell completion script (e.g. source <(seinectl completion bash))",
		Action: func(c *cli.Context) error {
			switch sh := c.Args().First(); sh {
			case "bash":
				_, err := fmt.Fprint(c.App.Writer, bashCompletion)
				return err
			case "zsh":
				_, err := fmt.Fprint(c.App.Writer, zshCompletion)
				return err
			case "fish":
				s, err := c.App.ToFishCompletion()
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(c.App.Writer, s)
				return err
			default:
				return fmt.Errorf("shell %q: want bash, zsh or fish", sh)
			}
		},
	}
}
